use super::*;
use std::time::Instant;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("teravm-files-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn image(path: &Path, max_bytes: u64) -> OpenRequest {
    OpenRequest {
        what: "test.image",
        path: path.to_path_buf(),
        spec: OpenSpec::ReadImage {
            max_bytes,
            head_bytes: 4,
            check: Some(|_, head| {
                if head.starts_with(b"GOOD") {
                    Ok(())
                } else {
                    Err("bad magic".into())
                }
            }),
        },
    }
}

fn output(path: &Path) -> OpenRequest {
    OpenRequest {
        what: "test.output",
        path: path.to_path_buf(),
        spec: OpenSpec::Output { blocking: false },
    }
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; the result is checked.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

fn reason(r: Result<Opened, FilesError>) -> String {
    match r {
        Err(FilesError::Refused { reason, .. }) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn an_image_is_a_regular_file_of_bounded_size_that_passes_its_check() {
    let d = dir("image");
    let good = d.join("good");
    std::fs::write(&good, b"GOODkernel").unwrap();
    let opened = open(&image(&good, 100)).unwrap();
    assert_eq!(opened.len, 10);
    let bad = d.join("bad");
    std::fs::write(&bad, b"EVILkernel").unwrap();
    assert_eq!(reason(open(&image(&bad, 100))), "bad magic");
    assert!(reason(open(&image(&good, 5))).contains("10 bytes"));
    let empty = d.join("empty");
    std::fs::write(&empty, b"").unwrap();
    assert!(reason(open(&image(&empty, 100))).contains("0 bytes"));
    assert!(reason(open(&image(&d, 100))).contains("a directory"));
    let zero = Path::new("/dev/zero");
    assert!(reason(open(&image(zero, 100))).contains("a character device"));
    assert!(reason(open(&image(&d.join("missing"), 100))).contains("No such file"));
    assert!(reason(open(&image(Path::new(""), 100))).contains("empty"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_fifo_as_an_image_is_refused_at_once() {
    let d = dir("fifo-image");
    let fifo = d.join("fifo");
    mkfifo(&fifo);
    let t = Instant::now();
    assert!(reason(open(&image(&fifo, 100))).contains("a FIFO"));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn output_is_created_0600_never_through_a_symlink() {
    use std::os::unix::fs::PermissionsExt;
    let d = dir("output");
    let log = d.join("log");
    let opened = open(&output(&log)).unwrap();
    let mode = std::fs::metadata(&log).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    drop(opened);
    let target = d.join("target");
    std::fs::write(&target, b"").unwrap();
    let link = d.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    assert!(reason(open(&output(&link))).contains("symlink"));
    let dangling = d.join("dangling");
    std::os::unix::fs::symlink(d.join("nowhere"), &dangling).unwrap();
    assert!(reason(open(&output(&dangling))).contains("symlink"));
    assert!(
        !d.join("nowhere").exists(),
        "created through a dangling symlink"
    );
    assert!(reason(open(&output(&d))).contains("Is a directory"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn output_to_a_fifo_with_no_reader_opens_without_blocking() {
    let d = dir("output-fifo");
    let fifo = d.join("fifo");
    mkfifo(&fifo);
    let t = Instant::now();
    let opened = open(&output(&fifo)).unwrap();
    assert!(t.elapsed() < Duration::from_secs(1));
    // SAFETY: F_GETFL on our own fd.
    let fl = unsafe { libc::fcntl(opened.file.as_raw_fd(), libc::F_GETFL) };
    assert_ne!(fl & libc::O_NONBLOCK, 0);
    let blocking = OpenRequest {
        spec: OpenSpec::Output { blocking: true },
        ..output(&fifo)
    };
    let opened = open(&blocking).unwrap();
    // SAFETY: as above.
    let fl = unsafe { libc::fcntl(opened.file.as_raw_fd(), libc::F_GETFL) };
    assert_eq!(fl & libc::O_NONBLOCK, 0);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn proc_and_sys_and_devices_are_refused_as_output() {
    for path in ["/proc/self/mem", "/proc/self/attr/current"] {
        let r = open(&output(Path::new(path)));
        assert!(r.is_err(), "{path} opened as output");
    }
    assert!(reason(open(&output(Path::new("/proc/self/mem")))).contains("procfs"));
    assert!(reason(open(&output(Path::new("/dev/zero")))).contains("character device"));
    open(&output(Path::new("/dev/null"))).unwrap();
}

#[test]
fn the_thread_answers_in_order_and_open_now_times_out() {
    let opener = FileOpener::spawn().unwrap();
    let d = dir("thread");
    let good = d.join("good");
    std::fs::write(&good, b"GOOD").unwrap();
    let files = opener
        .open_now(vec![image(&good, 10), output(&d.join("out"))], OPEN_TIMEOUT)
        .unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(files[1].path, d.join("out"));
    let e = opener
        .open_now(vec![image(&good, 10), image(&d, 10)], OPEN_TIMEOUT)
        .unwrap_err();
    assert!(matches!(e, FilesError::Refused { ref reason, .. } if reason.contains("directory")));
    let _ = std::fs::remove_dir_all(&d);
}

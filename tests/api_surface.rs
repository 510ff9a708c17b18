//! A walk over the whole API surface, with the default flags (seccomp on):
//! every endpoint and method of Firecracker's API and teravm's own, each
//! with a valid body and invalid ones, and every field that names a host
//! path with hostile paths (missing, a directory, `/dev/zero`, a FIFO, a
//! symlink, an unreadable file, relative, empty, NUL, too long), before
//! and after `InstanceStart`.
//!
//! Every case asserts that the answer is a 2xx, or a 4xx whose JSON body
//! has a non-empty `fault_message` (never a 5xx, never a dropped
//! connection), that it comes within [`ANSWER`], and that teravm is still
//! alive afterwards and answers `GET /`. Every host-path case also sends a
//! `GET /` on a second connection while the first request is outstanding
//! and asserts it answers within [`QUICK`]. The actions that end the VM
//! (`SendCtrlAltDel` once started, `Shutdown`) run last or in a process of
//! their own, and assert a clean exit instead.
//!
//! The walk does not stop at the first failure: it records every case (a
//! dead process is replaced by a fresh one in the same phase), then fails
//! with the whole list. The table of answers must equal
//! `docs/api-surface.md` (so every status of every case is pinned: a
//! change fails the test until the doc is regenerated and reviewed); with
//! `TERAVM_WRITE_API_TABLE=1` it writes that table to the doc first.
//! Malformed requests must answer a 4xx, the actions that end the VM a
//! 2xx and a clean exit.
mod common;
#[path = "common/surface/mod.rs"]
mod surface;

use std::fmt::Write as _;
use std::path::Path;

use common::*;
use surface::{shorten, Target, Walk};

/// Where `tests/fc_differential.rs`'s part of `docs/api-surface.md`
/// begins: this test owns the page up to it.
pub const DIFF_BEGIN: &str = "<!-- fc_differential: begin -->";

#[test]
fn every_endpoint_and_method_before_and_after_start() {
    if !kvm_or_skip("every_endpoint_and_method_before_and_after_start") {
        return;
    }
    let dir = temp_dir("surface");
    let target = Target {
        program: teravm().into(),
        boot_source: r#"{"boot_args": "then=idle"}"#.into(),
        boot_label: "valid (back to the firmware)".into(),
        wait_exit: true,
    };
    let mut w = surface::run(&dir, target);

    // The table is the doc: every answer of every case is pinned there.
    // The page's tail from DIFF_BEGIN on is the differential test's.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/api-surface.md");
    let table = table(&w);
    let split = |page: &str| -> (String, String) {
        match page.find(DIFF_BEGIN) {
            // Its part is followed by one blank line, then the differential's.
            Some(at) => (
                page[..at].strip_suffix('\n').unwrap_or(&page[..at]).into(),
                page[at..].into(),
            ),
            None => (page.into(), String::new()),
        }
    };
    if std::env::var_os("TERAVM_WRITE_API_TABLE").is_some_and(|v| v == "1") {
        let (_, diff_part) = split(&std::fs::read_to_string(&path).unwrap_or_default());
        let sep = if diff_part.is_empty() { "" } else { "\n" };
        std::fs::write(&path, format!("{table}{sep}{diff_part}")).unwrap();
        eprintln!("wrote {}", path.display());
    }
    let (doc, _) = split(&std::fs::read_to_string(&path).unwrap_or_default());
    if doc != table {
        let differ: Vec<String> = table
            .lines()
            .zip(
                doc.lines()
                    .chain(std::iter::repeat("<end of docs/api-surface.md>")),
            )
            .filter(|(t, d)| t != d)
            .take(10)
            .map(|(t, d)| format!("  walked: {t}\n  doc:    {d}"))
            .collect();
        w.failures.push(format!(
            "the answers differ from docs/api-surface.md (regenerate it: \
             TERAVM_WRITE_API_TABLE=1 cargo test --release --test api_surface, \
             and review the diff); first lines that differ:\n{}",
            if differ.is_empty() {
                "  (the doc has more lines)".to_string()
            } else {
                differ.join("\n")
            }
        ));
    }
    assert!(
        w.failures.is_empty(),
        "{} of the cases broke the rule:\n{}",
        w.failures.len(),
        w.failures.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The table: endpoint × case → the answer before and after the start.
fn table(w: &Walk) -> String {
    let mut out = String::from(TABLE_INTRO);
    let cell = |c: &Option<String>| c.as_deref().unwrap_or("–").replace('|', "\\|");
    let mut endpoints: Vec<&str> = Vec::new();
    for row in &w.rows {
        if !endpoints.contains(&row.endpoint.as_str()) {
            endpoints.push(&row.endpoint);
        }
    }
    for endpoint in endpoints {
        let _ = write!(
            out,
            "\n### `{endpoint}`\n\n| case | before InstanceStart | after InstanceStart |\n|---|---|---|\n"
        );
        for row in w.rows.iter().filter(|row| row.endpoint == endpoint) {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                row.case.replace('|', "\\|"),
                cell(&row.before),
                cell(&row.after)
            );
        }
    }
    let _ = write!(
        out,
        "\n## Cases that broke the rule in this run ({})\n\n",
        w.failures.len()
    );
    if w.failures.is_empty() {
        out.push_str("None.\n");
    }
    for f in &w.failures {
        let f = f.replace(w.dir.to_str().unwrap(), "$DIR");
        let _ = writeln!(out, "- {}", shorten(&f, 400).replace('|', "\\|"));
    }
    out
}

const TABLE_INTRO: &str = "\
# The API surface, walked

Generated by `tests/api_surface.rs` from one run against the real binary
with the default flags (seccomp on) and real `/dev/kvm`; do not edit by
hand. To regenerate:

```
TERAVM_WRITE_API_TABLE=1 cargo test --release --test api_surface
```

The walk sends every endpoint and method of Firecracker's API (its
swagger) and teravm's own (`/memory`, `/reclaim`), each with a valid body
and invalid ones (bad JSON, an unknown field, a wrong type, out-of-range
values, an empty body, a wrong method), once before `InstanceStart` and
once after it, on a 1-vCPU, 128 MiB firmware guest. Every field that names
a host path (`boot-source` `kernel_image_path` and `initrd_path`, `logger`
`log_path`, `metrics` `metrics_path`, `drives` `path_on_host` and `vsock`
`uds_path`) also gets hostile paths: a
missing file, a directory, `/dev/zero`, a FIFO with no other end (a fresh
one each time), a symlink to a real file and a dangling one, a chmod 000
file (the tests run as root, who reads it anyway: the case says so), a
relative path (teravm runs in the test's temp dir, where `real.txt`
exists), an empty string, a NUL inside, a 300-byte file name and a path
over 4096 bytes. `metrics_path` can be set once per process, so each of
its cases runs in a fresh teravm, followed by a `FlushMetrics`.

The rule for every case: the answer is a 2xx, or a 4xx whose JSON body has
a non-empty `fault_message`; it comes within 5 s; no 5xx, no dropped
connection; afterwards the process is alive (`try_wait`) and answers
`GET /`. For the host-path cases, a `GET /` on a second connection sent
while the request is outstanding must answer within 3 s. The actions that
end the VM (`SendCtrlAltDel` once started, `Shutdown` sync and async) run
last, each ending its own process, and must answer a 2xx and exit 0.
Malformed requests (bad JSON, an unknown field, a wrong type, out of
range, an empty body, not an object, a wrong method) must answer a 4xx.
The test fails when its table differs from this page: every answer below
is the expected one. Where a process dies,
the cell says so and the walk goes on with a fresh one in the same phase.

A cell is the status code and the start of the `fault_message`; `$DIR` is
the walk's temp dir. `–`: not sent in that phase.
";

/// Firecracker's swagger (`src/firecracker/swagger/firecracker.yaml`) at
/// the revision of the Firecracker build: beside that build's source
/// (`<cache>/bin/firecracker` → `<cache>/src/firecracker/...`), else out of
/// the source tarball the build script unpacks
/// (`../shared/peers/firecracker-81b38b9da.tar.gz`). None if neither is
/// there.
fn swagger(fc: &Path) -> Option<String> {
    const IN_TREE: &str = "src/firecracker/swagger/firecracker.yaml";
    if let Some(cache) = fc.parent().and_then(Path::parent) {
        let beside = cache.join("src/firecracker").join(IN_TREE);
        if let Ok(text) = std::fs::read_to_string(beside) {
            return Some(text);
        }
    }
    let tarball =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/peers/firecracker-81b38b9da.tar.gz");
    let out = std::process::Command::new("tar")
        .arg("-xzOf")
        .arg(&tarball)
        .arg(format!("firecracker/{IN_TREE}"))
        .output()
        .ok()?;
    (out.status.success() && !out.stdout.is_empty())
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The swagger's operations: (method in capitals, path with its `{id}`
/// filled in as [`fill`] does).
fn swagger_routes(yaml: &str) -> Vec<(String, String)> {
    let mut routes = Vec::new();
    let mut in_paths = false;
    let mut path = None;
    for line in yaml.lines() {
        if !line.starts_with(' ') && !line.trim().is_empty() {
            // A top-level section: `paths:`, `definitions:` ...
            in_paths = line.trim_end() == "paths:";
            path = None;
        } else if !in_paths {
        } else if let Some(p) = line.strip_prefix("  /").and_then(|p| p.strip_suffix(':')) {
            path = Some(fill(&format!("/{p}")));
        } else if let (Some(p), Some(m)) = (
            &path,
            line.strip_prefix("    ").and_then(|m| m.strip_suffix(':')),
        ) {
            if ["get", "put", "patch", "delete"].contains(&m) {
                routes.push((m.to_uppercase(), p.clone()));
            }
        }
    }
    routes
}

/// A path template with an id filled in.
fn fill(template: &str) -> String {
    template
        .replace("{drive_id}", "rootfs")
        .replace("{iface_id}", "eth0")
        .replace("{id}", "pmem0")
}

/// Firecracker's router matches only the first path segment for these
/// (src/firecracker/src/api_server/parsed_request.rs): `PUT /balloon/x` is
/// `PUT /balloon`, `GET`/`PATCH /mmds/x` are `GET`/`PATCH /mmds` (a `PATCH
/// /mmds/config` patches the store), `PATCH /vm/x` is `PATCH /vm`.
const FC_FIRST_SEGMENT: &str = "Firecracker's router reads only the first path segment here and \
                                takes it as the parent resource; teravm answers 405";
/// Routes one VMM takes and the other does not, each with its reason; the
/// test fails on a difference not here and on a row that no longer
/// differs.
const ROUTES_ONLY_ON: &[(&str, &str, &str, &str)] = &[
    ("teravm", "GET", "/memory", "teravm's own memory settings"),
    ("teravm", "PUT", "/memory", "teravm's own memory settings"),
    ("teravm", "GET", "/reclaim", "teravm's own reclaim settings"),
    ("teravm", "PUT", "/reclaim", "teravm's own reclaim settings"),
    (
        "firecracker",
        "PUT",
        "/pmem/pmem0",
        "teravm has no virtio-pmem",
    ),
    (
        "firecracker",
        "PATCH",
        "/pmem/pmem0",
        "teravm has no virtio-pmem",
    ),
    (
        "firecracker",
        "DELETE",
        "/pmem/pmem0",
        "teravm has no virtio-pmem",
    ),
    (
        "firecracker",
        "DELETE",
        "/drives/rootfs",
        "teravm has no device hot-unplug",
    ),
    (
        "firecracker",
        "DELETE",
        "/network-interfaces/eth0",
        "teravm has no device hot-unplug",
    ),
    (
        "firecracker",
        "PUT",
        "/balloon/statistics",
        FC_FIRST_SEGMENT,
    ),
    (
        "firecracker",
        "PUT",
        "/balloon/hinting/start",
        FC_FIRST_SEGMENT,
    ),
    (
        "firecracker",
        "PUT",
        "/balloon/hinting/status",
        FC_FIRST_SEGMENT,
    ),
    (
        "firecracker",
        "PUT",
        "/balloon/hinting/stop",
        FC_FIRST_SEGMENT,
    ),
    ("firecracker", "GET", "/mmds/config", FC_FIRST_SEGMENT),
    ("firecracker", "PATCH", "/mmds/config", FC_FIRST_SEGMENT),
    ("firecracker", "PATCH", "/vm/config", FC_FIRST_SEGMENT),
];

/// The routes, asked of the real Firecracker: every path of its swagger
/// and teravm's own, with each of GET, PUT, PATCH, DELETE (PUT and PATCH
/// with `{}`), sent to Firecracker and to teravm before `InstanceStart`.
/// A route is taken unless the answer says no such route: Firecracker's
/// 400 `Invalid request method and/or path` (or `Unrecognized ... path`),
/// teravm's 404 or 405. The two must take the same routes but for
/// [`ROUTES_ONLY_ON`]; and teravm must take every operation of the
/// swagger but those rows. So a route teravm drops, or one it adds
/// wrongly, fails here, whatever the golden table says.
#[test]
fn the_routes_are_firecrackers() {
    let test = "the_routes_are_firecrackers";
    let Some(fc) = firecracker(test) else {
        return;
    };
    let Some(yaml) = swagger(&fc) else {
        skip(
            test,
            "no Firecracker swagger beside its build or in ../shared/peers",
        );
        return;
    };
    let spec = swagger_routes(&yaml);
    assert!(spec.len() >= 30, "too few operations parsed: {spec:?}");
    let mut paths: Vec<String> = spec.iter().map(|(_, p)| p.clone()).collect();
    paths.extend(["/memory".to_string(), "/reclaim".to_string()]);
    paths.dedup();
    let both = common::fc_api::Both::start(test, &fc, &[]);
    let mut failures = Vec::new();
    let mut differ = Vec::new();
    for path in &paths {
        for method in ["GET", "PUT", "PATCH", "DELETE"] {
            let body = matches!(method, "PUT" | "PATCH").then_some("{}");
            let ((fs, fb), (ts, tb)) = both.ask(method, path, body);
            let fc_takes = !(fs == 400
                && (fb.contains("Invalid request method and/or path")
                    || fb.contains("Unrecognized")));
            let tv_takes = !matches!(ts, 404 | 405);
            let listed = ROUTES_ONLY_ON
                .iter()
                .find(|(_, m, p, _)| *m == method && p == path);
            if fc_takes != tv_takes {
                differ.push((method, path.clone()));
                let only = if fc_takes { "firecracker" } else { "teravm" };
                match listed {
                    Some((who, ..)) if *who == only => {}
                    _ => failures.push(format!(
                        "{method} {path}: taken by {only} only (Firecracker {fs} {fb:?}, \
                         teravm {ts} {tb:?}), not in ROUTES_ONLY_ON"
                    )),
                }
            }
            let in_spec = spec.iter().any(|(m, p)| m == method && p == path);
            if in_spec && !tv_takes && listed.is_none() {
                failures.push(format!(
                    "{method} {path}: in Firecracker's swagger, teravm answers {ts} {tb:?}"
                ));
            }
        }
    }
    for &(who, m, p, why) in ROUTES_ONLY_ON {
        if !differ.iter().any(|(dm, dp)| *dm == m && dp == p) {
            failures.push(format!(
                "ROUTES_ONLY_ON {who} {m} {p} ({why}): both take it now, or neither: delete the row"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

//! The devices of a microVM held, saved and restored through the VMM's
//! calls ([`Devices::hold`], [`Devices::save_state`],
//! [`Devices::restore_state`]), on real device threads over real guest
//! memory and a real KVM VM (its ioeventfds): a drive driven through its
//! MMIO window as a driver would, and the entropy device. Skipped where
//! there is no KVM (failed under `CI=true`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_bindings::virtio_blk as vb;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::devices::virtio::block::{BlockOptions, IoEngine};
use crate::devices::virtio::transport::mmio::regs;
use crate::devices::virtio::{status as st, wait_for, VIRTIO_F_VERSION_1};
use crate::devices::PioBus;
use crate::memory::{
    Backing, GuestMemory, HostTopology, MemoryOptions, NumaPolicy, PageSize, ViewMemory,
};
use crate::vstate::vm::Vm;

const MIB: u64 = 1 << 20;
const HDR: u64 = 2 * MIB;
const DATA: u64 = 3 * MIB;
const STATUS: u64 = 4 * MIB;

struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn kvm() -> bool {
    match Vm::available() {
        Ok(()) => true,
        Err(e) if std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true")) => {
            panic!("a KVM test cannot run in CI (CI=true): {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            false
        }
    }
}

/// A drive of 8 sectors, sector `s` filled with `s + 1`, and the entropy
/// device.
fn specs(file: &TempFile, io_engine: IoEngine) -> DeviceSpecs {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file.0)
        .unwrap();
    DeviceSpecs {
        drives: vec![DriveSpec {
            opts: BlockOptions {
                drive_id: "rootfs".into(),
                io_engine,
                ..BlockOptions::default()
            },
            file: Arc::new(f),
            is_root_device: true,
            partuuid: None,
        }],
        entropy: Some(Default::default()),
        ..DeviceSpecs::default()
    }
}

fn build(specs: &DeviceSpecs, memory: &GuestMemory, topo: &HostTopology) -> (Vm, Devices) {
    let vm = Vm::new().unwrap();
    let devices = Devices::build(specs, PioBus::default(), &vm, memory, topo).unwrap();
    (vm, devices)
}

fn wr(d: &Devices, off: u64, v: u32) {
    let base = d.blocks[0].slot.base;
    d.buses.mmio.write(base + off, &v.to_le_bytes());
}

/// The driver's steps up to DRIVER_OK for the drive, queue 0 on `q`.
fn start_drive(d: &Devices, q: &MockSplitQueue<'_, ViewMemory>) {
    let s = st::ACKNOWLEDGE | st::DRIVER;
    wr(d, regs::STATUS, st::ACKNOWLEDGE);
    wr(d, regs::STATUS, s);
    wr(d, regs::DRIVER_FEATURES_SEL, 1);
    wr(d, regs::DRIVER_FEATURES, (VIRTIO_F_VERSION_1 >> 32) as u32);
    wr(d, regs::STATUS, s | st::FEATURES_OK);
    wr(d, regs::QUEUE_NUM, 16);
    for (lo, a) in [
        (regs::QUEUE_DESC_LOW, q.desc_table_addr().0),
        (regs::QUEUE_DRIVER_LOW, q.avail_addr().0),
        (regs::QUEUE_DEVICE_LOW, q.used_addr().0),
    ] {
        wr(d, lo, a as u32);
        wr(d, lo + 4, (a >> 32) as u32);
    }
    wr(d, regs::QUEUE_READY, 1);
    wr(d, regs::STATUS, s | st::FEATURES_OK | st::DRIVER_OK);
}

fn desc(addr: u64, len: u32, flags: u32, next: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags as u16, next))
}

/// Queues a read of `sector` (descriptors from `at`) and notifies.
fn read(d: &Devices, mem: &ViewMemory, q: &MockSplitQueue<'_, ViewMemory>, at: u16, sector: u64) {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&vb::VIRTIO_BLK_T_IN.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    mem.write_slice(&h, GuestAddress(HDR)).unwrap();
    let (n, w) = (VRING_DESC_F_NEXT, VRING_DESC_F_WRITE);
    q.add_desc_chains(
        &[
            desc(HDR, 16, n, at + 1),
            desc(DATA, 512, w | n, at + 2),
            desc(STATUS, 1, w, 0),
        ],
        at,
    )
    .unwrap();
    wr(d, regs::QUEUE_NOTIFY, 0);
}

fn used_idx(q: &MockSplitQueue<'_, ViewMemory>) -> u16 {
    q.used().idx().load()
}

fn served(q: &MockSplitQueue<'_, ViewMemory>, n: u16) -> bool {
    wait_for(Instant::now() + Duration::from_secs(10), || {
        used_idx(q) == n
    })
}

#[test]
fn the_hold_and_the_state_go_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<DeviceHold>();
    send_sync::<DevicesState>();
}

#[test]
fn a_held_drive_serves_nothing_and_a_restored_one_goes_on_where_it_stood() {
    held_and_restored(IoEngine::Sync);
}

#[test]
fn the_same_with_io_uring() {
    held_and_restored(IoEngine::Async);
}

fn held_and_restored(engine: IoEngine) {
    if !kvm() {
        return;
    }
    let file = TempFile(
        std::env::temp_dir().join(format!("teravm-devsnap-{}-{engine:?}", std::process::id())),
    );
    let bytes: Vec<u8> = (0..8u8).flat_map(|s| [s + 1; 512]).collect();
    std::fs::File::create(&file.0)
        .unwrap()
        .write_all(&bytes)
        .unwrap();
    let topo = HostTopology::from_sysfs(Path::new("/sys")).unwrap();
    let opts = MemoryOptions {
        mem_bytes: 64 * MIB,
        page_size: PageSize::Small,
        backing: Backing::Anonymous,
        policy: NumaPolicy::Bind,
        ..MemoryOptions::default()
    };
    let memory = GuestMemory::new(&opts, &topo).unwrap();
    let view = memory.view();
    let mem: &ViewMemory = &view;
    let specs = specs(&file, engine);

    let (_vm, d) = build(&specs, &memory, &topo);
    let q = MockSplitQueue::create(mem, GuestAddress(MIB), 16);
    start_drive(&d, &q);
    read(&d, mem, &q, 0, 1);
    assert!(served(&q, 1), "the first read");

    // Held: a notification is not served, and the state says so.
    let hold = d.hold().unwrap();
    assert!(matches!(d.hold(), Err(DeviceError::AlreadyHeld)));
    read(&d, mem, &q, 3, 2);
    // Nothing to wait for: the test is that nothing happens.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(used_idx(&q), 1, "served while held");
    let state = d.save_state(&hold).unwrap();
    let keys: Vec<_> = state.devices.iter().map(|s| s.key.clone()).collect();
    assert_eq!(keys, [DeviceKey::Block("rootfs".into()), DeviceKey::Rng]);
    let t = &state.devices[0].transport;
    assert_eq!((t.queues[0].next_avail, t.queues[0].next_used), (1, 1));
    assert!(!state.devices[1].transport.device_ran());
    drop(hold);
    assert!(served(&q, 2), "served once let go");

    let hold = d.hold().unwrap();
    let state = d.save_state(&hold).unwrap();
    drop(hold);
    let t = &state.devices[0].transport;
    assert_eq!((t.queues[0].next_avail, t.queues[0].next_used), (2, 2));
    let state: DevicesState =
        serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    drop(d);

    // A state that lacks a device, or has another, is refused naming it.
    let (_vm3, d3) = build(&specs, &memory, &topo);
    let mut lacking = state.clone();
    lacking.devices.pop();
    let e = d3.restore_state(&lacking).unwrap_err();
    assert!(e.to_string().contains("entropy device"), "{e}");
    drop(d3);
    let (_vm4, d4) = build(&specs, &memory, &topo);
    let mut other = state.clone();
    other.devices[0].key = DeviceKey::Block("data".into());
    let e = d4.restore_state(&other).unwrap_err();
    assert!(e.to_string().contains("drive data"), "{e}");
    drop(d4);

    // Restored on devices built anew from the same specs, over the same
    // memory: the third read is the third used entry.
    let (_vm2, d2) = build(&specs, &memory, &topo);
    d2.restore_state(&state).unwrap();
    mem.write_obj(0u8, GuestAddress(DATA)).unwrap();
    read(&d2, mem, &q, 6, 3);
    assert!(served(&q, 3), "the restored drive serves the next read");
    let mut b = [0u8; 2];
    mem.read_slice(&mut b[..1], GuestAddress(DATA)).unwrap();
    mem.read_slice(&mut b[1..], GuestAddress(STATUS)).unwrap();
    assert_eq!(b, [4, 0], "sector 3 read, status OK");
}

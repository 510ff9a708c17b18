//! The transport register by register, with a made-up device over plain
//! guest memory (no KVM).

use std::sync::{Arc, Mutex};

use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::mmio::{regs, MmioError, MmioTransport, MMIO_MAGIC};
use crate::devices::virtio::{
    status, ActivateError, ActiveState, DeviceOffer, VirtioDevice, VirtioInterrupt,
    VirtioInterruptType, INT_CONFIG, INT_VRING, VIRTIO_F_VERSION_1,
};

type Mem = Arc<GuestMemoryMmap<()>>;

const OFFERED: u64 = VIRTIO_F_VERSION_1 | 1 << 3 | 1 << 40;

#[derive(Default)]
struct TestDevice {
    config: [u8; 8],
    generation: u32,
    activated: Vec<(u64, Vec<(bool, u16)>)>,
    resets: usize,
    interrupt: Option<Arc<dyn VirtioInterrupt>>,
    refuse: bool,
}

impl VirtioDevice<Mem> for TestDevice {
    fn offer(&self) -> DeviceOffer {
        DeviceOffer {
            device_type: 42,
            avail_features: OFFERED,
            queue_sizes: &[16, 8],
        }
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, d) in data.iter_mut().enumerate() {
            *d = *self.config.get(offset as usize + i).unwrap_or(&0);
        }
    }
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        for (i, d) in data.iter().enumerate() {
            if let Some(c) = self.config.get_mut(offset as usize + i) {
                *c = *d;
            }
        }
    }
    fn config_generation(&self) -> u32 {
        self.generation
    }
    fn activate(&mut self, active: ActiveState<Mem>) -> Result<(), ActivateError> {
        if self.refuse {
            return Err(ActivateError::QueueNotReady(0));
        }
        let q = active
            .queues
            .iter()
            .map(|q| (q.ready(), q.size()))
            .collect();
        self.activated.push((active.acked_features, q));
        self.interrupt = Some(active.interrupt);
        Ok(())
    }
    fn reset(&mut self) {
        self.resets += 1;
        self.interrupt = None;
    }
}

struct Rig {
    dev: Arc<Mutex<TestDevice>>,
    t: MmioTransport<Mem>,
}

fn rig() -> Rig {
    let mem: Mem = Arc::new(
        GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 1 << 20),
            (GuestAddress(2 << 20), 1 << 20),
        ])
        .unwrap(),
    );
    let dev = Arc::new(Mutex::new(TestDevice::default()));
    let t = MmioTransport::new(dev.clone(), mem, EventFd::new(EFD_NONBLOCK).unwrap()).unwrap();
    Rig { dev, t }
}

fn rd(t: &MmioTransport<Mem>, off: u64) -> u32 {
    let mut b = [0u8; 4];
    t.read(off, &mut b).unwrap();
    u32::from_le_bytes(b)
}

fn wr(t: &mut MmioTransport<Mem>, off: u64, v: u32) -> Result<(), MmioError> {
    t.write(off, &v.to_le_bytes())
}

fn negotiate(t: &mut MmioTransport<Mem>, features: u64) -> Result<(), MmioError> {
    wr(t, regs::STATUS, status::ACKNOWLEDGE)?;
    wr(t, regs::STATUS, status::ACKNOWLEDGE | status::DRIVER)?;
    wr(t, regs::DRIVER_FEATURES_SEL, 0)?;
    wr(t, regs::DRIVER_FEATURES, features as u32)?;
    wr(t, regs::DRIVER_FEATURES_SEL, 1)?;
    wr(t, regs::DRIVER_FEATURES, (features >> 32) as u32)?;
    wr(
        t,
        regs::STATUS,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
    )
}

/// Sets up queue `q` of size `size` with rings at `base` (+0, +0x400, +0x800).
fn setup_queue(t: &mut MmioTransport<Mem>, q: u32, size: u32, base: u64) {
    wr(t, regs::QUEUE_SEL, q).unwrap();
    wr(t, regs::QUEUE_NUM, size).unwrap();
    for (lo, a) in [
        (regs::QUEUE_DESC_LOW, base),
        (regs::QUEUE_DRIVER_LOW, base + 0x400),
        (regs::QUEUE_DEVICE_LOW, base + 0x800),
    ] {
        wr(t, lo, a as u32).unwrap();
        wr(t, lo + 4, (a >> 32) as u32).unwrap();
    }
    wr(t, regs::QUEUE_READY, 1).unwrap();
}

const UP: u32 = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;

#[test]
fn identity_registers() {
    let r = rig();
    assert_eq!(rd(&r.t, regs::MAGIC_VALUE), MMIO_MAGIC);
    assert_eq!(rd(&r.t, regs::MAGIC_VALUE), 0x7472_6976);
    assert_eq!(rd(&r.t, regs::VERSION), 2);
    assert_eq!(rd(&r.t, regs::DEVICE_ID), 42);
    assert_eq!(rd(&r.t, regs::VENDOR_ID), 0);
    assert_eq!(rd(&r.t, regs::SHM_LEN_LOW), u32::MAX, "no shared memory");
    // Registers are 32-bit: other widths read zero and are refused.
    let mut b = [0xffu8; 2];
    assert!(r.t.read(regs::MAGIC_VALUE, &mut b).is_err());
    assert_eq!(b, [0, 0]);
    let mut b = [0u8; 4];
    assert!(r.t.read(regs::MAGIC_VALUE + 2, &mut b).is_err());
}

#[test]
fn both_feature_pages() {
    let mut r = rig();
    wr(&mut r.t, regs::DEVICE_FEATURES_SEL, 0).unwrap();
    assert_eq!(rd(&r.t, regs::DEVICE_FEATURES), OFFERED as u32);
    wr(&mut r.t, regs::DEVICE_FEATURES_SEL, 1).unwrap();
    assert_eq!(rd(&r.t, regs::DEVICE_FEATURES), (OFFERED >> 32) as u32);
    assert_eq!(
        rd(&r.t, regs::DEVICE_FEATURES) & 1,
        1,
        "VERSION_1 is bit 32"
    );
    wr(&mut r.t, regs::DEVICE_FEATURES_SEL, 2).unwrap();
    assert_eq!(rd(&r.t, regs::DEVICE_FEATURES), 0);
    negotiate(&mut r.t, OFFERED).unwrap();
    assert_eq!(r.t.status(), UP);
}

#[test]
fn features_ok_refused_for_features_not_offered() {
    for bad in [OFFERED | 1 << 5, OFFERED & !VIRTIO_F_VERSION_1, 1 << 3] {
        let mut r = rig();
        let e = negotiate(&mut r.t, bad).unwrap_err();
        assert!(matches!(e, MmioError::FeaturesRefused { .. }), "{e}");
        assert_eq!(rd(&r.t, regs::STATUS) & status::FEATURES_OK, 0);
    }
    // A bit in a page past the second is never offered.
    let mut r = rig();
    wr(&mut r.t, regs::STATUS, status::ACKNOWLEDGE).unwrap();
    wr(&mut r.t, regs::STATUS, status::ACKNOWLEDGE | status::DRIVER).unwrap();
    wr(&mut r.t, regs::DRIVER_FEATURES_SEL, 1).unwrap();
    wr(&mut r.t, regs::DRIVER_FEATURES, 1).unwrap();
    wr(&mut r.t, regs::DRIVER_FEATURES_SEL, 2).unwrap();
    wr(&mut r.t, regs::DRIVER_FEATURES, 1).unwrap();
    assert!(wr(&mut r.t, regs::STATUS, UP).is_err());
    assert_eq!(r.t.status() & status::FEATURES_OK, 0);
}

#[test]
fn features_written_only_while_negotiating() {
    let mut r = rig();
    assert!(matches!(
        wr(&mut r.t, regs::DRIVER_FEATURES, 1),
        Err(MmioError::FeaturesNotNegotiating(0))
    ));
    negotiate(&mut r.t, VIRTIO_F_VERSION_1).unwrap();
    assert!(wr(&mut r.t, regs::DRIVER_FEATURES, 1 << 3).is_err());
}

#[test]
fn status_steps_in_order_and_never_clears_bits() {
    let mut r = rig();
    assert!(wr(&mut r.t, regs::STATUS, status::DRIVER).is_err());
    assert_eq!(r.t.status(), 0);
    wr(&mut r.t, regs::STATUS, status::ACKNOWLEDGE).unwrap();
    assert!(wr(
        &mut r.t,
        regs::STATUS,
        status::ACKNOWLEDGE | status::DRIVER_OK
    )
    .is_err());
    wr(&mut r.t, regs::STATUS, status::ACKNOWLEDGE | status::DRIVER).unwrap();
    assert!(
        wr(&mut r.t, regs::STATUS, status::DRIVER).is_err(),
        "clears ACKNOWLEDGE"
    );
    assert_eq!(r.t.status(), status::ACKNOWLEDGE | status::DRIVER);
}

#[test]
fn queue_setup_only_between_features_ok_and_driver_ok() {
    let mut r = rig();
    wr(&mut r.t, regs::QUEUE_SEL, 0).unwrap();
    assert_eq!(rd(&r.t, regs::QUEUE_NUM_MAX), 16);
    wr(&mut r.t, regs::QUEUE_SEL, 1).unwrap();
    assert_eq!(rd(&r.t, regs::QUEUE_NUM_MAX), 8);
    wr(&mut r.t, regs::QUEUE_SEL, 2).unwrap();
    assert_eq!(rd(&r.t, regs::QUEUE_NUM_MAX), 0, "no such queue");
    wr(&mut r.t, regs::QUEUE_SEL, 0).unwrap();
    // Before FEATURES_OK.
    let e = wr(&mut r.t, regs::QUEUE_NUM, 8).unwrap_err();
    assert!(matches!(e, MmioError::QueueSetupNotAllowed { .. }), "{e}");
    assert!(wr(&mut r.t, regs::QUEUE_READY, 1).is_err());
    assert_eq!(rd(&r.t, regs::QUEUE_READY), 0);
    negotiate(&mut r.t, VIRTIO_F_VERSION_1).unwrap();
    setup_queue(&mut r.t, 0, 8, 0x1000);
    setup_queue(&mut r.t, 1, 8, 0x2000);
    assert_eq!(rd(&r.t, regs::QUEUE_READY), 1);
    wr(&mut r.t, regs::STATUS, UP | status::DRIVER_OK).unwrap();
    assert_eq!(r.t.status(), UP | status::DRIVER_OK);
    {
        let d = r.dev.lock().unwrap();
        assert_eq!(
            d.activated,
            vec![(VIRTIO_F_VERSION_1, vec![(true, 8), (true, 8)])]
        );
    }
    // After DRIVER_OK.
    wr(&mut r.t, regs::QUEUE_SEL, 0).unwrap();
    assert!(wr(&mut r.t, regs::QUEUE_DESC_LOW, 0x8000).is_err());
    assert!(wr(&mut r.t, regs::QUEUE_READY, 1).is_err());
    assert_eq!(rd(&r.t, regs::QUEUE_READY), 1);
    assert_eq!(r.dev.lock().unwrap().resets, 0);
}

/// virtio 1.2, 4.2.2.2: "To stop using the queue the driver MUST write zero
/// (0x0) to this QueueReady register and MUST read the value back to ensure
/// synchronization." virtio-drivers does it when a driver is dropped, and
/// spins until it reads 0.
#[test]
fn queue_ready_0_while_running_stops_the_device_and_reads_back_0() {
    let mut r = rig();
    negotiate(&mut r.t, VIRTIO_F_VERSION_1).unwrap();
    setup_queue(&mut r.t, 0, 8, 0x1000);
    setup_queue(&mut r.t, 1, 8, 0x2000);
    wr(&mut r.t, regs::STATUS, UP | status::DRIVER_OK).unwrap();
    let pending = rd(&r.t, regs::INTERRUPT_STATUS);
    wr(&mut r.t, regs::INTERRUPT_ACK, pending).unwrap();
    wr(&mut r.t, regs::QUEUE_SEL, 1).unwrap();
    wr(&mut r.t, regs::QUEUE_READY, 0).unwrap();
    assert_eq!(rd(&r.t, regs::QUEUE_READY), 0, "the last value written");
    assert_eq!(r.dev.lock().unwrap().resets, 1, "the device stopped");
    assert_eq!(
        r.t.status(),
        UP | status::DRIVER_OK | status::DEVICE_NEEDS_RESET
    );
    assert_eq!(rd(&r.t, regs::INTERRUPT_STATUS) & INT_CONFIG, INT_CONFIG);
    // The other queue too, without stopping the device twice.
    wr(&mut r.t, regs::QUEUE_SEL, 0).unwrap();
    wr(&mut r.t, regs::QUEUE_READY, 0).unwrap();
    assert_eq!(rd(&r.t, regs::QUEUE_READY), 0);
    assert_eq!(r.dev.lock().unwrap().resets, 1);
    // It runs again only after a reset and a new set-up.
    assert!(wr(&mut r.t, regs::QUEUE_READY, 1).is_err());
    wr(&mut r.t, regs::STATUS, 0).unwrap();
    negotiate(&mut r.t, VIRTIO_F_VERSION_1).unwrap();
    setup_queue(&mut r.t, 0, 8, 0x1000);
    wr(&mut r.t, regs::STATUS, UP | status::DRIVER_OK).unwrap();
    assert_eq!(r.t.status(), UP | status::DRIVER_OK);
}

#[test]
fn bad_queue_sizes_need_a_reset() {
    for size in [0u32, 3, 32, 0x1_0000] {
        let mut r = rig();
        negotiate(&mut r.t, VIRTIO_F_VERSION_1).unwrap();
        setup_queue(&mut r.t, 1, 8, 0x2000);
        wr(&mut r.t, regs::QUEUE_SEL, 0).unwrap();
        let e = wr(&mut r.t, regs::QUEUE_NUM, size).unwrap_err();
        assert!(matches!(e, MmioError::BadQueueSize { .. }), "{e}");
        wr(&mut r.t, regs::QUEUE_READY, 1).unwrap();
        assert!(wr(&mut r.t, regs::STATUS, UP | status::DRIVER_OK).is_err());
        let s = r.t.status();
        assert_eq!(s & status::DRIVER_OK, 0, "size {size}");
        assert_ne!(s & status::DEVICE_NEEDS_RESET, 0, "size {size}");
        assert_ne!(rd(&r.t, regs::INTERRUPT_STATUS) & INT_CONFIG, 0);
        assert!(r.dev.lock().unwrap().activated.is_empty());
        // Nothing more is accepted until a reset.
        assert!(wr(&mut r.t, regs::QUEUE_NUM, 8).is_err());
        wr(&mut r.t, regs::STATUS, 0).unwrap();
        assert_eq!(r.t.status(), 0);
    }
}

#[test]
fn rings_outside_ram_or_misaligned_need_a_reset() {
    // In the hole between the regions, past the end, straddling a region's
    // end, misaligned.
    for base in [0x10_0000u64, 0x40_0000, 0xf_f800, 0x1008, 1 << 40] {
        let mut r = rig();
        negotiate(&mut r.t, VIRTIO_F_VERSION_1).unwrap();
        setup_queue(&mut r.t, 0, 16, base);
        assert!(
            wr(&mut r.t, regs::STATUS, UP | status::DRIVER_OK).is_err(),
            "{base:#x}"
        );
        assert_ne!(r.t.status() & status::DEVICE_NEEDS_RESET, 0, "{base:#x}");
        assert!(r.dev.lock().unwrap().activated.is_empty());
    }
    // A queue not made ready is not checked, and is handed over not ready.
    let mut r = rig();
    negotiate(&mut r.t, VIRTIO_F_VERSION_1).unwrap();
    setup_queue(&mut r.t, 1, 8, 0x20_0000);
    wr(&mut r.t, regs::STATUS, UP | status::DRIVER_OK).unwrap();
    assert_eq!(
        r.dev.lock().unwrap().activated[0].1,
        vec![(false, 16), (true, 8)]
    );
}

#[test]
fn device_refusing_to_start_needs_a_reset() {
    let mut r = rig();
    r.dev.lock().unwrap().refuse = true;
    negotiate(&mut r.t, VIRTIO_F_VERSION_1).unwrap();
    let e = wr(&mut r.t, regs::STATUS, UP | status::DRIVER_OK).unwrap_err();
    assert!(matches!(e, MmioError::Activate(_)), "{e}");
    assert_eq!(r.t.status(), UP | status::DEVICE_NEEDS_RESET);
}

#[test]
fn interrupt_status_and_ack() {
    let mut r = rig();
    negotiate(&mut r.t, VIRTIO_F_VERSION_1).unwrap();
    wr(&mut r.t, regs::STATUS, UP | status::DRIVER_OK).unwrap();
    let irq = r.dev.lock().unwrap().interrupt.clone().unwrap();
    assert_eq!(rd(&r.t, regs::INTERRUPT_STATUS), 0);
    irq.trigger(VirtioInterruptType::Queue(0)).unwrap();
    assert_eq!(rd(&r.t, regs::INTERRUPT_STATUS), INT_VRING);
    irq.trigger(VirtioInterruptType::Config).unwrap();
    assert_eq!(rd(&r.t, regs::INTERRUPT_STATUS), INT_VRING | INT_CONFIG);
    assert_eq!(
        r.t.interrupt().irq_evt().read().unwrap(),
        2,
        "irqfd signalled twice"
    );
    wr(&mut r.t, regs::INTERRUPT_ACK, INT_VRING).unwrap();
    assert_eq!(rd(&r.t, regs::INTERRUPT_STATUS), INT_CONFIG);
    wr(&mut r.t, regs::INTERRUPT_ACK, INT_CONFIG).unwrap();
    assert_eq!(rd(&r.t, regs::INTERRUPT_STATUS), 0);
    assert!(
        wr(&mut r.t, regs::INTERRUPT_STATUS, 1).is_err(),
        "read-only"
    );
}

#[test]
fn config_space_and_generation() {
    let mut r = rig();
    r.t.write(0x100 + 2, &[7, 8]).unwrap();
    let mut b = [0u8; 4];
    r.t.read(0x100, &mut b).unwrap();
    assert_eq!(b, [0, 0, 7, 8]);
    let mut one = [0u8; 1];
    r.t.read(0x103, &mut one).unwrap();
    assert_eq!(one, [8]);
    // Past the window.
    assert!(r.t.read(0xffe, &mut b).is_err());
    assert!(r.t.write(0x1000, &[1]).is_err());
    let g0 = rd(&r.t, regs::CONFIG_GENERATION);
    r.dev.lock().unwrap().generation += 1;
    assert_ne!(rd(&r.t, regs::CONFIG_GENERATION), g0);
}

#[test]
fn queue_notify_writes_the_queue_eventfd() {
    let mut r = rig();
    wr(&mut r.t, regs::QUEUE_NOTIFY, 1).unwrap();
    wr(&mut r.t, regs::QUEUE_NOTIFY, 1).unwrap();
    assert_eq!(r.t.queue_evts()[1].read().unwrap(), 2);
    assert!(r.t.queue_evts()[0].read().is_err(), "queue 0 not notified");
    assert!(matches!(
        wr(&mut r.t, regs::QUEUE_NOTIFY, 2),
        Err(MmioError::NoSuchQueue(2))
    ));
    assert!(wr(&mut r.t, regs::MAGIC_VALUE, 0).is_err());
}

#[test]
fn reset_clears_everything_and_tells_the_device() {
    let mut r = rig();
    negotiate(&mut r.t, VIRTIO_F_VERSION_1).unwrap();
    setup_queue(&mut r.t, 0, 8, 0x1000);
    wr(&mut r.t, regs::STATUS, UP | status::DRIVER_OK).unwrap();
    let irq = r.dev.lock().unwrap().interrupt.clone().unwrap();
    irq.trigger(VirtioInterruptType::Queue(0)).unwrap();
    wr(&mut r.t, regs::STATUS, 0).unwrap();
    assert_eq!(rd(&r.t, regs::STATUS), 0);
    assert_eq!(rd(&r.t, regs::INTERRUPT_STATUS), 0);
    assert_eq!(rd(&r.t, regs::QUEUE_READY), 0);
    assert_eq!(r.dev.lock().unwrap().resets, 1);
    // Set up again from scratch; the old driver features are gone.
    negotiate(&mut r.t, VIRTIO_F_VERSION_1 | 1 << 3).unwrap();
    wr(&mut r.t, regs::STATUS, UP | status::DRIVER_OK).unwrap();
    let d = r.dev.lock().unwrap();
    assert_eq!(d.activated.len(), 2);
    assert_eq!(
        d.activated[1],
        (VIRTIO_F_VERSION_1 | 1 << 3, vec![(false, 16), (false, 8)])
    );
}

#[test]
fn bad_max_queue_size_refused_at_construction() {
    struct Bad;
    impl VirtioDevice<Mem> for Bad {
        fn offer(&self) -> DeviceOffer {
            DeviceOffer {
                device_type: 1,
                avail_features: 0,
                queue_sizes: &[12],
            }
        }
        fn read_config(&self, _: u64, _: &mut [u8]) {}
        fn write_config(&mut self, _: u64, _: &[u8]) {}
        fn activate(&mut self, _: ActiveState<Mem>) -> Result<(), ActivateError> {
            Ok(())
        }
        fn reset(&mut self) {}
    }
    let mem: Mem = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
    let e = MmioTransport::new(
        Arc::new(Mutex::new(Bad)),
        mem,
        EventFd::new(EFD_NONBLOCK).unwrap(),
    )
    .unwrap_err();
    assert!(matches!(e, MmioError::BadMaxQueueSize { size: 12, .. }));
}

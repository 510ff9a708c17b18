//! The intended differences between teravm and Firecracker in the walk,
//! each with its reason; `pending: <branch>` marks a gap another branch of
//! issue 26 closes (the integrator deletes those rows as each merges).
//!
//! An `endpoint` or `case` ending in `*` matches by prefix, one starting
//! with `*` by suffix, `*x*` what contains `x`, `*` alone anything. An exact row must differ in every case it matches; a row with a
//! `*` must differ in at least one (so each row stays true).

use super::surface::Phase;

/// One intended difference: the case (in `phase`, or in both when None)
/// and why teravm answers otherwise.
#[derive(Debug)]
pub struct Intended {
    pub phase: Option<Phase>,
    pub endpoint: &'static str,
    pub case: &'static str,
    pub why: &'static str,
    pub pending: Option<&'static str>,
}

impl Intended {
    /// Whether the row is a pattern (it need not differ in every case).
    pub fn is_pattern(&self) -> bool {
        self.endpoint.contains('*') || self.case.contains('*')
    }
}

fn matches(pattern: &str, s: &str) -> bool {
    match (pattern.strip_prefix('*'), pattern.strip_suffix('*')) {
        (Some(_), Some(_)) if pattern.len() > 1 => s.contains(&pattern[1..pattern.len() - 1]),
        (Some(""), _) => true,
        (Some(suffix), None) => s.ends_with(suffix),
        (None, Some(prefix)) => s.starts_with(prefix),
        _ => pattern == s,
    }
}

/// The listed row of a case, if any.
pub fn find(phase: Phase, endpoint: &str, case: &str) -> Option<&'static Intended> {
    INTENDED.iter().find(|i| {
        matches(i.endpoint, endpoint) && matches(i.case, case) && i.phase.is_none_or(|p| p == phase)
    })
}

const B: Option<Phase> = Some(Phase::Before);
const A: Option<Phase> = Some(Phase::After);
const BOTH: Option<Phase> = None;

const HTTP_CODES: &str = "teravm answers 405 (a method the path does not take) and 404 (no such \
                          path) as HTTP has them; Firecracker answers 400 to both; both with a \
                          fault_message";
const FIRMWARE: &str = "teravm extension: without kernel_image_path the built-in firmware boots";
const EARLY_KERNEL: &str = "safer: teravm checks the kernel and initrd at PUT (a regular file, \
                            an ELF or bzImage kernel), Firecracker only opens them and fails the \
                            InstanceStart; on a FIFO Firecracker's API hangs for good (timeout)";
const HOST_FILES: &str = "safer: teravm opens log and metrics files with O_NOFOLLOW and only as \
                          a regular file, FIFO or terminal (no /dev/zero, no symlink)";
const WHILE_RUNNING: &str = "teravm extension: the logger and the metrics may be set while the \
                             microVM runs; Firecracker refuses both after InstanceStart";
const STRICT: &str = "teravm checks every field (unknown fields and bad values refused); \
                      Firecracker accepts this body";
const METRICS_ONCE: &str = "a consequence of the row above: Firecracker's metrics were already \
                            set by the body with the unknown field, and can be set once";
const OWN: &str = "teravm's own resources (/memory, /reclaim) and its Shutdown action";
const MEM_BOUNDS: &str = "safer: teravm bounds mem_size_mib at PUT (16 MiB to 64 TiB); \
                          Firecracker accepts it and fails the start";
const NO_DEV_NULL: &str = "safer: teravm takes a regular file or a block device as a drive, not \
                           a character device such as /dev/null or /dev/zero (the PATCH after \
                           start follows: teravm has no such drive)";
const NO_TAP: &str = "safer: teravm never creates a tap; Firecracker's TUNSETIFF creates tap0 \
                      (the PATCH after start follows: teravm has no eth0)";
const NO_TAP_MMDS: &str = "a consequence of the tap row: the MMDS config names eth0, which \
                           Firecracker has (it made tap0) and teravm has not";
const ARRAY: &str = "safer: teravm takes a custom CPU template only as a JSON object; \
                     Firecracker's serde also takes an array as the struct's fields in order";
const CID: &str = "safer: teravm refuses the guest CIDs the vsock spec reserves (1 local, \
                   2 the host) and u32::MAX; 0 it takes, as firecracker-containerd sends it";
const UDS_EMPTY: &str = "safer: teravm refuses an empty uds_path; Firecracker accepts it";
const HINTING: &str = "safer: teravm refuses free page hinting: a guest takes hinted pages back \
                       without telling the device (Linux's shrinker does), so a discard still in \
                       flight could zero a page in use; free page reporting, which the guest \
                       waits on, gives the same memory back. The rows after start follow: \
                       Firecracker's last balloon has hinting and no statistics";
const NO_DRIVER: &str = "the test guest does not drive the balloon: Firecracker refuses a \
                         target before the driver activates the device, teravm records it and \
                         tells the driver when it comes";

pub static INTENDED: &[Intended] = &[
    row(BOTH, "*", "wrong method", HTTP_CODES, None),
    row(BOTH, "*", "not a resource", HTTP_CODES, None),
    row(
        B,
        "PUT /machine-config",
        "out of range (mem_size_mib *",
        MEM_BOUNDS,
        None,
    ),
    row(B, "PUT /boot-source", "valid", FIRMWARE, None),
    row(
        B,
        "PUT /boot-source",
        "kernel_image_path: *",
        EARLY_KERNEL,
        None,
    ),
    row(B, "PUT /boot-source", "initrd_path: *", EARLY_KERNEL, None),
    row(B, "PUT /logger", "bad module", STRICT, None),
    row(B, "PUT /logger", "log_path: *", HOST_FILES, None),
    row(B, "PUT /metrics", "metrics_path: *", HOST_FILES, None),
    row(B, "PUT /metrics", "unknown field", STRICT, None),
    row(B, "PUT /metrics", "valid", METRICS_ONCE, None),
    row(A, "PUT /logger", "*", WHILE_RUNNING, None),
    row(A, "PUT /metrics", "metrics_path: *", WHILE_RUNNING, None),
    row(BOTH, "* /memory", "valid", OWN, None),
    row(BOTH, "* /reclaim", "valid", OWN, None),
    row(A, "PUT /actions", "Shutdown *", OWN, None),
    row(B, "PUT /balloon", "free_page_hinting true", HINTING, None),
    row(A, "GET /balloon/hinting/status", "valid", HINTING, None),
    row(A, "GET /balloon/statistics", "valid", HINTING, None),
    row(A, "PATCH /balloon/statistics", "valid", HINTING, None),
    row(A, "PATCH /balloon", "valid", NO_DRIVER, None),
    row(B, "PUT /drives/rootfs", "valid", NO_DEV_NULL, None),
    row(
        B,
        "PUT /drives/rootfs",
        "path_on_host: /dev/zero",
        NO_DEV_NULL,
        None,
    ),
    row(
        B,
        "PUT /drives/rootfs",
        "io_engine Async",
        NO_DEV_NULL,
        None,
    ),
    row(B, "PUT /drives/rootfs", "rate_limiter", NO_DEV_NULL, None),
    row(A, "PATCH /drives/rootfs", "valid", NO_DEV_NULL, None),
    row(B, "PUT /network-interfaces/eth0", "*", NO_TAP, None),
    row(A, "PATCH /network-interfaces/eth0", "valid", NO_TAP, None),
    row(B, "PUT /mmds/config", "valid", NO_TAP_MMDS, None),
    row(B, "PUT /cpu-config", "not an object ([])", ARRAY, None),
    row(B, "PUT /vsock", "out of range (guest_cid 1)", CID, None),
    row(B, "PUT /vsock", "guest_cid 2", CID, None),
    row(B, "PUT /vsock", "uds_path: empty string", UDS_EMPTY, None),
    row(
        B,
        "PUT /hotplug/memory",
        "total_size_mib 4294967168 (above teravm's 64 TiB)",
        "safer: teravm refuses at PUT a hotplug region above 64 TiB (it lies above guest RAM in \
         the guest physical address space); Firecracker takes it and fails the InstanceStart",
        None,
    ),
    row(
        A,
        "PATCH /hotplug/memory",
        "valid",
        "kinder: teravm takes a target as soon as the microVM runs and the guest's driver reads \
         it when it comes up; Firecracker refuses every PATCH until the driver has activated \
         the device (\"Device is not active\"), which the walk's guest never does",
        None,
    ),
];

const fn row(
    phase: Option<Phase>,
    endpoint: &'static str,
    case: &'static str,
    why: &'static str,
    pending: Option<&'static str>,
) -> Intended {
    Intended {
        phase,
        endpoint,
        case,
        why,
        pending,
    }
}

/// The fields of a 200 body that may differ from Firecracker's, each with
/// its reason: (the `GET` path, the dotted field, why). Used by
/// `the_200_bodies_are_firecrackers`, which fails on a field that differs
/// and is not here, and on a row no field needs.
pub const BODY_DIFFERS: &[(&str, &str, &str)] = &[
    (
        "/vm/config",
        "memory",
        "teravm's own section (docs/firecracker.md: `memory` and `reclaim` sit beside them)",
    ),
    ("/vm/config", "reclaim", "teravm's own section"),
    ("/machine-config", "cpu_template", CPU_TEMPLATE_NONE),
    (
        "/vm/config",
        "machine-config.cpu_template",
        CPU_TEMPLATE_NONE,
    ),
    (
        "/vm/config",
        "pmem",
        "found by this test (issue 34), not changed yet: teravm has no virtio-pmem and leaves the \
         section out; Firecracker shows `[]`",
    ),
];

const CPU_TEMPLATE_NONE: &str = "found by this test (issue 34), not changed yet: teravm shows \
                                 `\"cpu_template\": \"None\"`; Firecracker leaves the field out \
                                 when no template is set";

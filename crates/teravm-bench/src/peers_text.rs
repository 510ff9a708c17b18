//! The lines `--peers` adds below the table: what each VMM held resident
//! when its clock started (median per row and case, and how much of it in
//! transparent huge pages), and a note for each THP row that got few huge
//! pages, with the host's THP settings that explain it. Pure functions over
//! values.

use std::fmt::Write as _;

use crate::model::{Case, Method, Pages, Sample};
use crate::report::cases_of;
use crate::stats::median;

/// The setting selected in a `transparent_hugepage` sysfs file (the word
/// in brackets: `[madvise]` → `madvise`).
pub fn selected_setting(text: &str) -> Option<&str> {
    text.split_whitespace()
        .find(|w| w.starts_with('['))
        .map(|w| w.trim_matches(|c| c == '[' || c == ']'))
}

/// Median resident and huge-page bytes of `method`'s runs in `case`.
fn resident_medians(samples: &[Sample], case: Case, method: Method) -> Option<(f64, f64)> {
    let of: Vec<_> = samples
        .iter()
        .filter(|s| s.case == case && s.method == method)
        .filter_map(|s| s.resident)
        .collect();
    let bytes: Vec<f64> = of.iter().map(|r| r.bytes as f64).collect();
    let huge: Vec<f64> = of.iter().map(|r| r.huge_bytes as f64).collect();
    Some((median(&bytes)?, median(&huge)?))
}

/// The methods with residency in `case`, in the table's order.
fn methods_with_resident(samples: &[Sample], case: Case) -> Vec<Method> {
    let mut methods: Vec<Method> = samples
        .iter()
        .filter(|s| s.case == case && s.resident.is_some())
        .map(|s| s.method)
        .collect();
    methods.sort();
    methods.dedup();
    methods
}

const MIB: f64 = (1u64 << 20) as f64;

/// One line per `--peers` row and case: the median resident size when the
/// clock started and how much of it was in huge pages; empty when none ran.
pub fn resident_text(samples: &[Sample]) -> String {
    let mut out = String::new();
    for case in cases_of(samples) {
        for method in methods_with_resident(samples, case) {
            let Some((bytes, huge)) = resident_medians(samples, case, method) else {
                continue;
            };
            if out.is_empty() {
                out.push_str(
                    "resident when the clock started (median; VmRSS, and of it in huge \
                     pages: AnonHugePages + ShmemPmdMapped):\n",
                );
            }
            let touched: Vec<f64> = samples
                .iter()
                .filter(|s| s.case == case && s.method == method)
                .filter_map(|s| s.touched_mib.map(|m| m as f64))
                .collect();
            let guest = median(&touched)
                .map(|m| format!(" (the guest said it touched {m:.0} MiB)"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {method} {case}: {:.0} MiB, {:.0} MiB in huge pages{guest}",
                bytes / MIB,
                huge / MIB
            );
        }
    }
    out
}

/// The guest RAM of `case`, in bytes, and the median huge-page bytes of
/// each `--peers` row in it.
fn huge_of_rows(samples: &[Sample], case: Case) -> (f64, Vec<(Method, f64)>) {
    let size = samples
        .iter()
        .find(|s| s.case == case)
        .map_or(0.0, |s| (s.size_gib << 30) as f64);
    let rows = methods_with_resident(samples, case)
        .into_iter()
        .filter_map(|m| Some((m, resident_medians(samples, case, m)?.1)))
        .collect();
    (size, rows)
}

/// A note for each THP case where `--peers` rows' VMMs had less than nine
/// tenths of the guest RAM in huge pages: which rows, the fewest huge
/// pages, and the host's THP settings (`enabled`, and for memfd
/// `shmem_enabled`, as read from sysfs; `None` where unreadable); and for
/// each 4 KiB case where one had more than a tenth in huge pages (its THP
/// was not off).
pub fn huge_page_notes(
    samples: &[Sample],
    thp_enabled: Option<&str>,
    shmem_enabled: Option<&str>,
) -> Vec<String> {
    let mut notes = Vec::new();
    for case in cases_of(samples) {
        let (size, rows) = huge_of_rows(samples, case);
        let thp = case.pages == Pages::Thp;
        let odd: Vec<&(Method, f64)> = rows
            .iter()
            .filter(|(_, huge)| {
                if thp {
                    huge * 10.0 < size * 9.0
                } else {
                    huge * 10.0 > size
                }
            })
            .collect();
        let names: Vec<String> = odd.iter().map(|(m, _)| m.to_string()).collect();
        let hugest = odd.iter().map(|(_, h)| *h).max_by(f64::total_cmp);
        let fewest = odd.iter().map(|(_, h)| *h).min_by(f64::total_cmp);
        let (Some(most), Some(least)) = (hugest, fewest) else {
            continue;
        };
        if !thp {
            notes.push(format!(
                "note: {case}: {} had over a tenth of {:.0} MiB in huge pages (most {:.0} \
                 MiB): their THP was not off",
                names.join(", "),
                size / MIB,
                most / MIB
            ));
            continue;
        }
        let setting = |name: &str, v: Option<&str>| {
            format!("{name} [{}]", v.and_then(selected_setting).unwrap_or("?"))
        };
        let mut why = setting("transparent_hugepage/enabled", thp_enabled);
        if case.backing == teravm::config::Backing::Memfd {
            why = format!("{why}, {}", setting("shmem_enabled", shmem_enabled));
        }
        notes.push(format!(
            "note: {case}: {} had under nine tenths of {:.0} MiB in huge pages \
             (fewest {:.0} MiB; {why})",
            names.join(", "),
            size / MIB,
            least / MIB
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Peer, Resident, Stop};
    use teravm::config::Backing;

    fn sample(method: Method, pages: Pages, backing: Backing, huge_mib: u64) -> Sample {
        Sample {
            case: Case { pages, backing },
            method,
            size_gib: 1,
            chunk_mib: None,
            run: 1,
            seconds: 0.5,
            reply_ms: None,
            phases: [None; 4],
            live: None,
            resident: Some(Resident {
                bytes: 1100 << 20,
                huge_bytes: huge_mib << 20,
            }),
            populate_ms: None,
            touched_mib: None,
        }
    }

    #[test]
    fn residency_is_listed_per_row_and_case() {
        let quit = Method::Peer(Peer::Qemu, Stop::Graceful);
        let samples = [
            sample(quit, Pages::FourK, Backing::Anonymous, 0),
            sample(Method::VmPrealloc(2), Pages::FourK, Backing::Anonymous, 0),
        ];
        let text = resident_text(&samples);
        assert!(
            text.starts_with("resident when the clock started"),
            "{text}"
        );
        assert!(
            text.contains("  qemu-prealloc-quit 4k anonymous: 1100 MiB, 0 MiB in huge pages\n"),
            "{text}"
        );
        assert!(text.contains("  vm-prealloc-teravm-2 4k anonymous: 1100 MiB"));
        let mut none = samples[0];
        none.resident = None;
        assert_eq!(resident_text(&[none]), "");
        // A guest row says what its guest touched.
        let mut g = sample(
            Method::PeerGuest(Peer::Firecracker, Stop::Graceful),
            Pages::FourK,
            Backing::Anonymous,
            0,
        );
        g.touched_mib = Some(1006);
        assert!(resident_text(&[g]).contains(
            "  firecracker-guest-ctrlaltdel 4k anonymous: 1100 MiB, 0 MiB in huge pages \
             (the guest said it touched 1006 MiB)\n"
        ));
    }

    #[test]
    fn thp_rows_without_huge_pages_get_a_note() {
        let quit = Method::Peer(Peer::Qemu, Stop::Graceful);
        let samples = [
            sample(quit, Pages::Thp, Backing::Anonymous, 1020),
            sample(Method::VmPrealloc(2), Pages::Thp, Backing::Anonymous, 600),
            sample(quit, Pages::Thp, Backing::Memfd, 0),
            // 4 KiB rows are meant to have none.
            sample(quit, Pages::FourK, Backing::Anonymous, 0),
        ];
        let notes = huge_page_notes(
            &samples,
            Some("always [madvise] never\n"),
            Some("always within_size advise [never] deny force\n"),
        );
        assert_eq!(
            notes,
            [
                "note: thp anonymous: vm-prealloc-teravm-2 had under nine tenths of 1024 MiB \
                 in huge pages (fewest 600 MiB; transparent_hugepage/enabled [madvise])",
                "note: thp memfd: qemu-prealloc-quit had under nine tenths of 1024 MiB in huge pages \
                 (fewest 0 MiB; transparent_hugepage/enabled [madvise], shmem_enabled [never])"
            ]
        );
        assert_eq!(selected_setting("[always] madvise never"), Some("always"));
        // A 4 KiB row with huge pages is said too.
        let four_k = [sample(quit, Pages::FourK, Backing::Anonymous, 512)];
        assert_eq!(
            huge_page_notes(&four_k, None, None),
            [
                "note: 4k anonymous: qemu-prealloc-quit had over a tenth of 1024 MiB in huge pages \
              (most 512 MiB): their THP was not off"
            ]
        );
        assert_eq!(selected_setting(""), None);
    }
}

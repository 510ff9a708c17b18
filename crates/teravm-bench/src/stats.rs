//! Statistics over the times of repeated runs: median, range, throughput and
//! ratios. Pure functions over values.

/// The summary of the times, in seconds, of one method's runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// How many runs.
    pub runs: usize,
    /// The median time (the mean of the two middle ones for an even count).
    pub median_s: f64,
    /// The fastest run.
    pub min_s: f64,
    /// The slowest run.
    pub max_s: f64,
}

impl Summary {
    /// Summarises the times of a method's runs; `None` for no runs.
    pub fn of(times_s: &[f64]) -> Option<Summary> {
        let median_s = median(times_s)?;
        let (min_s, max_s) = min_max(times_s)?;
        Some(Summary {
            runs: times_s.len(),
            median_s,
            min_s,
            max_s,
        })
    }
}

/// The median of `values`: the middle one for an odd count, the mean of the
/// two middle ones for an even count; `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        Some(sorted[mid])
    } else {
        Some((sorted[mid - 1] + sorted[mid]) / 2.0)
    }
}

/// The `p`-th percentile of `values` (0 < `p` ≤ 100) by the nearest-rank
/// method: the smallest value with at least `p`% of the values at or below
/// it (so the 99th percentile of fewer than 100 values is the largest);
/// `None` when empty.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() || !(p > 0.0 && p <= 100.0) {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The smallest and largest of `values`; `None` when empty.
pub fn min_max(values: &[f64]) -> Option<(f64, f64)> {
    let first = *values.first()?;
    Some(
        values
            .iter()
            .fold((first, first), |(lo, hi), &v| (lo.min(v), hi.max(v))),
    )
}

/// How many times faster `time_s` is than `baseline_s` (`baseline_s /
/// time_s`: above 1 means faster than the baseline); `None` when either time
/// is not a positive finite number.
pub fn speedup(baseline_s: f64, time_s: f64) -> Option<f64> {
    let valid = |t: f64| t.is_finite() && t > 0.0;
    if valid(baseline_s) && valid(time_s) {
        Some(baseline_s / time_s)
    } else {
        None
    }
}

/// Throughput in GiB/s of freeing `bytes` in `time_s`; `None` for a time
/// that is not positive.
pub fn gib_per_s(bytes: u64, time_s: f64) -> Option<f64> {
    if time_s.is_finite() && time_s > 0.0 {
        Some(bytes as f64 / (1u64 << 30) as f64 / time_s)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_count_is_the_middle_value() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[5.0]), Some(5.0));
        assert_eq!(median(&[9.0, 1.0, 7.0, 3.0, 5.0]), Some(5.0));
    }

    #[test]
    fn median_of_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[1.0, 2.0]), Some(1.5));
    }

    #[test]
    fn median_of_nothing_is_none() {
        assert_eq!(median(&[]), None);
        assert_eq!(min_max(&[]), None);
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 99.0), Some(3.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[1.0], 0.0), None);
    }

    #[test]
    fn min_max_finds_both_ends() {
        assert_eq!(min_max(&[2.0, 0.5, 7.0, 3.0]), Some((0.5, 7.0)));
        assert_eq!(min_max(&[1.25]), Some((1.25, 1.25)));
    }

    #[test]
    fn summary_combines_median_and_range() {
        let s = Summary::of(&[0.3, 0.1, 0.2, 0.4]).unwrap();
        assert_eq!(s.runs, 4);
        assert!((s.median_s - 0.25).abs() < 1e-12);
        assert_eq!((s.min_s, s.max_s), (0.1, 0.4));
    }

    #[test]
    fn speedup_is_baseline_over_time() {
        assert_eq!(speedup(2.0, 0.5), Some(4.0));
        assert_eq!(speedup(1.0, 2.0), Some(0.5));
        assert_eq!(speedup(1.0, 0.0), None);
        assert_eq!(speedup(0.0, 1.0), None);
        assert_eq!(speedup(f64::NAN, 1.0), None);
    }

    #[test]
    fn throughput_in_gib_per_second() {
        assert_eq!(gib_per_s(8 << 30, 2.0), Some(4.0));
        assert_eq!(gib_per_s(1 << 30, 0.0), None);
    }
}

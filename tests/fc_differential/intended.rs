//! The intended differences between teravm and Firecracker in the walk,
//! each with its reason; `pending: <branch>` marks a gap another branch of
//! issue 26 closes (the integrator deletes those rows as each merges).

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

/// The listed row of a case, if any.
pub fn find(phase: Phase, endpoint: &str, case: &str) -> Option<&'static Intended> {
    INTENDED
        .iter()
        .find(|i| i.endpoint == endpoint && i.case == case && i.phase.is_none_or(|p| p == phase))
}

pub static INTENDED: &[Intended] = &[];

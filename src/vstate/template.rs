//! CPU templates, in Firecracker's shapes: the static ones named in
//! `machine-config.cpu_template` (C3, T2, T2S, T2CL on Intel; T2A on AMD),
//! and the custom template of `PUT /cpu-config` (`cpuid_modifiers`,
//! `msr_modifiers`, `kvm_capabilities`).
//!
//! A static template is taken before start and checked at start, as
//! Firecracker checks it: the host's vendor, then its family/model/stepping
//! against the models the template was made for. A host outside that list
//! gets the reason (Firecracker's `InvalidCpuModel`, which this host, an
//! Emerald Rapids, also gets from Firecracker for every static template).
//! teravm has not written the static templates' bitmaps; on a host they fit
//! it says so instead of booting without them.
//!
//! A custom template's CPUID modifiers are applied to the supported CPUID
//! before the topology ([`super::linux::cpuid`]), as Firecracker applies
//! them before its normalization; a leaf the host does not offer is an
//! error at start. MSR modifiers apply to the MSRs teravm sets at boot
//! ([`super::msrs::boot_msrs`]); another MSR, and any
//! `kvm_capabilities`, are refused when the template is put.

use kvm_bindings::{kvm_cpuid_entry2, kvm_msr_entry, CpuId};
use serde::{Deserialize, Deserializer, Serialize};

/// Errors of CPU templates.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    /// The host's vendor is not the template's.
    #[error("cpu_template {template}: it is for {wanted} CPUs and this host is {host}")]
    Vendor {
        /// The template.
        template: &'static str,
        /// The vendor it is for.
        wanted: &'static str,
        /// The host's vendor.
        host: String,
    },
    /// The host's model is not one the template was made for.
    #[error(
        "cpu_template {template}: it is only for {models}; this host is family {family:#x} \
         model {model:#x} stepping {stepping} (Firecracker refuses it too)"
    )]
    Model {
        /// The template.
        template: &'static str,
        /// The models it is for.
        models: &'static str,
        /// The host's family.
        family: u32,
        /// The host's model.
        model: u32,
        /// The host's stepping.
        stepping: u32,
    },
    /// The host fits, but teravm lacks the template's masks.
    #[error(
        "cpu_template {0}: teravm has not implemented this template's CPUID and MSR masks; \
         use a custom template (PUT /cpu-config) or None"
    )]
    NotImplemented(&'static str),
    /// A custom CPUID modifier names a leaf the host does not offer.
    #[error("cpu-config: CPUID leaf {0:#x} subleaf {1:#x} is not offered by this host's KVM")]
    NoLeaf(u32, u32),
    /// A custom template field teravm does not take.
    #[error("cpu-config: {0}")]
    Unsupported(String),
    /// The CPUID list could not be rebuilt.
    #[error("cpu-config: {0}")]
    CpuidList(String),
}

/// A register bitmap: `0b` then up to `BITS` of `0`, `1`, `x` (keep) and
/// `_`, the last character bit 0. Bits that are `0`/`1` are in `filter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bitmap {
    /// The bits set by the template.
    pub filter: u64,
    /// Their values.
    pub value: u64,
}

impl Bitmap {
    /// `old` with the template's bits.
    pub fn apply(&self, old: u64) -> u64 {
        (old & !self.filter) | self.value
    }

    fn parse(s: &str, bits: u32) -> Result<Bitmap, String> {
        let digits = s.strip_prefix("0b").unwrap_or(s);
        let mut b = Bitmap::default();
        let mut i = 0u32;
        for c in digits.bytes().rev() {
            if c == b'_' {
                continue;
            }
            if i == bits {
                return Err(format!("bitmap {s:?} is longer than {bits} bits"));
            }
            match c {
                b'x' => {}
                b'0' => b.filter |= 1 << i,
                b'1' => {
                    b.filter |= 1 << i;
                    b.value |= 1 << i;
                }
                _ => return Err(format!("bitmap {s:?}: {:?} is not 0, 1, x or _", c as char)),
            }
            i += 1;
        }
        Ok(b)
    }
}

/// A number as Firecracker's templates write it: `0x` hex, `0b` binary, or
/// a JSON number.
fn number<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum N {
        Int(u32),
        Str(String),
    }
    match N::deserialize(d)? {
        N::Int(n) => Ok(n),
        N::Str(s) => {
            let r = if let Some(h) = s.strip_prefix("0x") {
                u32::from_str_radix(h, 16)
            } else if let Some(b) = s.strip_prefix("0b") {
                u32::from_str_radix(b, 2)
            } else {
                return Err(serde::de::Error::custom(format!(
                    "{s:?} has no 0x or 0b prefix"
                )));
            };
            r.map_err(|e| serde::de::Error::custom(format!("{s:?}: {e}")))
        }
    }
}

/// A CPUID register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Register {
    /// EAX.
    Eax,
    /// EBX.
    Ebx,
    /// ECX.
    Ecx,
    /// EDX.
    Edx,
}

/// One register of a CPUID modifier.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterModifier {
    /// Which register.
    pub register: Register,
    /// Its bits, 32.
    #[serde(deserialize_with = "bitmap32")]
    pub bitmap: Bitmap,
}

fn bitmap32<'de, D: Deserializer<'de>>(d: D) -> Result<Bitmap, D::Error> {
    Bitmap::parse(&String::deserialize(d)?, 32).map_err(serde::de::Error::custom)
}

fn bitmap64<'de, D: Deserializer<'de>>(d: D) -> Result<Bitmap, D::Error> {
    Bitmap::parse(&String::deserialize(d)?, 64).map_err(serde::de::Error::custom)
}

/// A CPUID leaf modifier.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuidModifier {
    /// The leaf.
    #[serde(deserialize_with = "number")]
    pub leaf: u32,
    /// The subleaf.
    #[serde(deserialize_with = "number")]
    pub subleaf: u32,
    /// KVM's flags for the entry.
    pub flags: u32,
    /// The registers.
    pub modifiers: Vec<RegisterModifier>,
}

/// An MSR modifier.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MsrModifier {
    /// The MSR.
    #[serde(deserialize_with = "number")]
    pub addr: u32,
    /// Its bits, 64.
    #[serde(deserialize_with = "bitmap64")]
    pub bitmap: Bitmap,
}

/// The body of `PUT /cpu-config`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomTemplate {
    /// KVM capabilities to check ("N") or not ("!N"): refused unless empty.
    #[serde(default)]
    pub kvm_capabilities: Vec<String>,
    /// CPUID modifiers.
    #[serde(default)]
    pub cpuid_modifiers: Vec<CpuidModifier>,
    /// MSR modifiers.
    #[serde(default)]
    pub msr_modifiers: Vec<MsrModifier>,
}

impl CustomTemplate {
    /// Refuses what teravm does not apply.
    pub fn validate(&self) -> Result<(), TemplateError> {
        if !self.kvm_capabilities.is_empty() {
            return Err(TemplateError::Unsupported(
                "kvm_capabilities is not supported: teravm checks no KVM capability list to \
                 add to or take from; leave it empty"
                    .into(),
            ));
        }
        let boot: Vec<u32> = super::msrs::boot_msrs().iter().map(|m| m.index).collect();
        for m in &self.msr_modifiers {
            if !boot.contains(&m.addr) {
                return Err(TemplateError::Unsupported(format!(
                    "msr_modifiers: MSR {:#x} is not one teravm sets at boot ({}); only those \
                     take a modifier",
                    m.addr,
                    boot.iter()
                        .map(|a| format!("{a:#x}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        Ok(())
    }
}

/// What every vCPU is configured with: the CPUID (templates applied,
/// topology not yet), whether SMT, and the boot MSRs (templates applied).
#[derive(Debug, Clone)]
pub struct CpuSetup {
    /// The CPUID before each vCPU's topology.
    pub cpuid: CpuId,
    /// Two threads per core.
    pub smt: bool,
    /// The boot MSRs of a Linux guest.
    pub msrs: Vec<kvm_msr_entry>,
}

impl CpuSetup {
    /// The setup from KVM's `supported` CPUID and the templates.
    pub fn new(
        supported: CpuId,
        smt: bool,
        template: CpuTemplate,
        custom: Option<&CustomTemplate>,
    ) -> Result<CpuSetup, TemplateError> {
        check_static(template, supported.as_slice())?;
        let mut entries = supported.as_slice().to_vec();
        let mut msrs = super::msrs::boot_msrs();
        if let Some(t) = custom {
            t.validate()?;
            apply_cpuid(&mut entries, t)?;
            for m in &t.msr_modifiers {
                for e in msrs.iter_mut().filter(|e| e.index == m.addr) {
                    e.data = m.bitmap.apply(e.data);
                }
            }
        }
        let cpuid = CpuId::from_entries(&entries)
            .map_err(|e| TemplateError::CpuidList(format!("{e:?}")))?;
        Ok(CpuSetup { cpuid, smt, msrs })
    }
}

/// Applies `t`'s CPUID modifiers to `entries`.
pub fn apply_cpuid(
    entries: &mut [kvm_cpuid_entry2],
    t: &CustomTemplate,
) -> Result<(), TemplateError> {
    for m in &t.cpuid_modifiers {
        let e = entries
            .iter_mut()
            .find(|e| e.function == m.leaf && e.index == m.subleaf)
            .ok_or(TemplateError::NoLeaf(m.leaf, m.subleaf))?;
        e.flags = m.flags;
        for r in &m.modifiers {
            let reg = match r.register {
                Register::Eax => &mut e.eax,
                Register::Ebx => &mut e.ebx,
                Register::Ecx => &mut e.ecx,
                Register::Edx => &mut e.edx,
            };
            *reg = r.bitmap.apply(u64::from(*reg)) as u32;
        }
    }
    Ok(())
}

/// A CPU's family, model and stepping.
type Fms = (u32, u32, u32);

/// (vendor, models by name, the (family, model, stepping) it fits).
fn static_fit(t: CpuTemplate) -> Option<(&'static str, &'static str, &'static [Fms])> {
    const SKYLAKE: Fms = (6, 0x55, 4);
    const CASCADE_LAKE: Fms = (6, 0x55, 7);
    const ICE_LAKE: Fms = (6, 0x6a, 6);
    const MILAN: Fms = (0x19, 0x01, 1);
    Some(match t {
        CpuTemplate::None => return None,
        CpuTemplate::C3 | CpuTemplate::T2 => (
            "GenuineIntel",
            "Intel Skylake, Cascade Lake and Ice Lake",
            &[SKYLAKE, CASCADE_LAKE, ICE_LAKE],
        ),
        CpuTemplate::T2S => (
            "GenuineIntel",
            "Intel Skylake and Cascade Lake",
            &[SKYLAKE, CASCADE_LAKE],
        ),
        CpuTemplate::T2CL => (
            "GenuineIntel",
            "Intel Cascade Lake and Ice Lake",
            &[CASCADE_LAKE, ICE_LAKE],
        ),
        CpuTemplate::T2A => ("AuthenticAMD", "AMD Milan", &[MILAN]),
    })
}

/// The vendor string of leaf 0 and the (family, model, stepping) of leaf 1,
/// with the extended family and model folded in.
fn host_model(entries: &[kvm_cpuid_entry2]) -> (String, Fms) {
    let leaf = |f: u32| {
        entries
            .iter()
            .find(|e| e.function == f)
            .copied()
            .unwrap_or_default()
    };
    let l0 = leaf(0);
    let vendor: Vec<u8> = [l0.ebx, l0.edx, l0.ecx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .collect();
    let eax = leaf(1).eax;
    let base_family = (eax >> 8) & 0xf;
    let family = base_family
        + if base_family == 0xf {
            (eax >> 20) & 0xff
        } else {
            0
        };
    let model = ((eax >> 4) & 0xf) | (((eax >> 16) & 0xf) << 4);
    (
        String::from_utf8_lossy(&vendor).into_owned(),
        (family, model, eax & 0xf),
    )
}

/// Checks a static template against the host, as Firecracker does at start.
pub fn check_static(t: CpuTemplate, entries: &[kvm_cpuid_entry2]) -> Result<(), TemplateError> {
    let Some((wanted, models, fits)) = static_fit(t) else {
        return Ok(());
    };
    let (vendor, (family, model, stepping)) = host_model(entries);
    if vendor != wanted {
        return Err(TemplateError::Vendor {
            template: t.name(),
            wanted,
            host: vendor,
        });
    }
    if !fits.contains(&(family, model, stepping)) {
        return Err(TemplateError::Model {
            template: t.name(),
            models,
            family,
            model,
            stepping,
        });
    }
    Err(TemplateError::NotImplemented(t.name()))
}

#[cfg(test)]
#[path = "template_tests.rs"]
mod tests;

/// A static CPU template, as Firecracker names them (`None`: the host's
/// CPUID as KVM offers it). Firecracker takes any of them in
/// `machine-config` and checks the host at `InstanceStart`; teravm does the
/// same ([`crate::vstate::template`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum CpuTemplate {
    /// No template.
    #[default]
    None,
    /// Intel C3 (Skylake, Cascade Lake, Ice Lake).
    C3,
    /// Intel T2 (Skylake, Cascade Lake, Ice Lake).
    T2,
    /// Intel T2S (Skylake, Cascade Lake).
    T2S,
    /// Intel T2CL (Cascade Lake, Ice Lake).
    T2CL,
    /// AMD T2A (Milan).
    T2A,
}

impl CpuTemplate {
    /// Its name as it travels in JSON.
    pub fn name(self) -> &'static str {
        match self {
            CpuTemplate::None => "None",
            CpuTemplate::C3 => "C3",
            CpuTemplate::T2 => "T2",
            CpuTemplate::T2S => "T2S",
            CpuTemplate::T2CL => "T2CL",
            CpuTemplate::T2A => "T2A",
        }
    }
}

//! The parts of the configuration that exist for Firecracker's clients: the
//! `logger` and `metrics` sections, the sections of features teravm does not
//! have (`pmem`), accepted only when empty, the `cpu-config` given inline or
//! as a file, and the checks the sections share (resource ids, host paths,
//! rate limiters). The `machine-config` shape Firecracker's clients send,
//! and its partial update, are with the section in [`super::machine`].

use std::path::PathBuf;

use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{invalid, ConfigError};

/// A log level as Firecracker's clients spell it: `Off`, `Error`, `Warn` or
/// `Warning`, `Info`, `Debug`, `Trace`, in any case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLevel(pub log::LevelFilter);

impl FromStr for LogLevel {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let filter = match s.to_ascii_lowercase().as_str() {
            "off" => log::LevelFilter::Off,
            "error" => log::LevelFilter::Error,
            "warn" | "warning" => log::LevelFilter::Warn,
            "info" => log::LevelFilter::Info,
            "debug" => log::LevelFilter::Debug,
            "trace" => log::LevelFilter::Trace,
            _ => return Err(ConfigError::LogLevel(s.to_string())),
        };
        Ok(LogLevel(filter))
    }
}

impl<'de> Deserialize<'de> for LogLevel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for LogLevel {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self.0 {
            log::LevelFilter::Off => "Off",
            log::LevelFilter::Error => "Error",
            log::LevelFilter::Warn => "Warn",
            log::LevelFilter::Info => "Info",
            log::LevelFilter::Debug => "Debug",
            log::LevelFilter::Trace => "Trace",
        })
    }
}

/// The `logger` section and the body of `PUT /logger`: the same settings as
/// the `--log-path`, `--level`, `--show-level`, `--show-log-origin` and
/// `--module` flags. Absent fields keep their value.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggerConfig {
    /// A file or FIFO to write log lines to instead of stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_path: Option<PathBuf>,
    /// The most verbose level written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<LogLevel>,
    /// Whether lines show their level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub show_level: Option<bool>,
    /// Whether lines show the source file and line they come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub show_log_origin: Option<bool>,
    /// Only records of modules whose path starts with this (e.g. `teravm::vmm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

/// Longest module filter accepted.
const MAX_MODULE_LEN: usize = 256;

impl LoggerConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(path) = &self.log_path {
            check_path("logger.log_path", path)?;
        }
        if let Some(module) = &self.module {
            if module.is_empty()
                || module.len() > MAX_MODULE_LEN
                || !module
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            {
                return Err(invalid(
                    "logger.module",
                    format!(
                        "{module:?} is not a module path (1..={MAX_MODULE_LEN} letters, digits, \
                         '_' and ':')"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The `metrics` section and the body of `PUT /metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// A file or FIFO that gets one JSON object per line.
    pub metrics_path: PathBuf,
}

impl MetricsConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_path("metrics.metrics_path", &self.metrics_path)
    }
}

pub(crate) fn check_path(field: &'static str, path: &std::path::Path) -> Result<(), ConfigError> {
    let bytes = path.as_os_str().as_encoded_bytes();
    if bytes.is_empty() || bytes.len() > 4096 || bytes.contains(&0) {
        return Err(invalid(
            field,
            "must be a non-empty path of at most 4096 bytes without NUL",
        ));
    }
    Ok(())
}

/// Longest resource id (`drive_id`, `iface_id`), in bytes.
pub const MAX_ID_LEN: usize = 64;

/// Checks a resource id (`drive_id`, `iface_id`, and the id in the path of
/// `/drives/{id}` and `/network-interfaces/{id}`): 1 to [`MAX_ID_LEN`]
/// ASCII letters, digits and `_`. (Firecracker takes any Unicode letter or
/// digit and sets no length limit.)
pub fn check_id(field: &'static str, id: &str) -> Result<(), ConfigError> {
    if id.is_empty()
        || id.len() > MAX_ID_LEN
        || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(invalid(
            field,
            format!("{id:?} is not an id (1..={MAX_ID_LEN} ASCII letters, digits and underscores)"),
        ));
    }
    Ok(())
}

/// Refuses a rate limiter: teravm has none, so only an absent or `null`
/// one is taken.
pub fn check_no_rate_limiter(
    field: &'static str,
    limiter: &Option<serde_json::Value>,
) -> Result<(), ConfigError> {
    // A limiter that limits nothing (`{}`, or buckets all null, as Kata
    // sends on every interface) is what Firecracker takes as no limit.
    let limits = |v: &serde_json::Value| match v {
        serde_json::Value::Null => false,
        serde_json::Value::Object(m) => m.values().any(|b| !b.is_null()),
        _ => true,
    };
    if limiter.as_ref().is_some_and(limits) {
        return Err(invalid(
            field,
            "rate limiters are not supported by teravm; leave it out, send null or {} (no limit)",
        ));
    }
    Ok(())
}

/// A Firecracker section for a feature teravm does not have: accepted
/// when absent, `null`, `[]` or `{}`, refused otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(transparent)]
pub struct UnsupportedSection(Option<serde_json::Value>);

impl UnsupportedSection {
    /// Whether the section asks for nothing.
    pub fn is_empty(&self) -> bool {
        match &self.0 {
            None | Some(serde_json::Value::Null) => true,
            Some(serde_json::Value::Array(a)) => a.is_empty(),
            Some(serde_json::Value::Object(o)) => o.is_empty(),
            Some(_) => false,
        }
    }

    /// An error naming `section` unless it is empty.
    pub fn check(&self, section: &'static str) -> Result<(), ConfigError> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::NotSupported(section))
        }
    }
}

/// The config file's `cpu-config`, as Firecracker takes it
/// (`CustomCpuTemplateOrPath`): the custom template inline, or the path of a
/// JSON file holding it (read here as the config file is read, at most
/// [`super::MAX_CONFIG_FILE_BYTES`]).
pub fn cpu_config_inline_or_path<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<crate::vstate::template::CustomTemplate>, D::Error> {
    use serde::de::Error;
    let value = match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => return Ok(None),
        serde_json::Value::String(path) => {
            let text = super::read_text(std::path::Path::new(&path))
                .map_err(|e| D::Error::custom(format!("cpu-config: cannot read {path:?}: {e}")))?;
            serde_json::from_str(&text)
                .map_err(|e| D::Error::custom(format!("cpu-config {path:?}: {e}")))?
        }
        other => other,
    };
    serde_json::from_value(value)
        .map(Some)
        .map_err(|e| D::Error::custom(format!("cpu-config: {e}")))
}

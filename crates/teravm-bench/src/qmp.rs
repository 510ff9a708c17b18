//! A small client of QEMU's machine protocol (QMP) over a Unix socket: the
//! greeting, `qmp_capabilities`, commands and their replies, events skipped.
//!
//! QMP is one JSON object per line each way. QEMU sends a greeting
//! (`{"QMP": {"version": ...}}`) once its main loop runs (after it has
//! preallocated guest RAM), refuses every command but `qmp_capabilities`
//! until that is sent, answers each command with `{"return": ...}` or
//! `{"error": {"class", "desc"}}`, and sends events (`{"event": ...}`) at
//! any time, before or after a reply (QMP `quit`'s `SHUTDOWN` event comes
//! before its return). The parser ([`parse`]) is a pure function over a line;
//! [`Qmp`] does the I/O on one thread, with a read timeout on every wait.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde_json::Value;

/// Errors of a QMP conversation.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// Reading or writing the socket failed (a timeout among them).
    #[error("QMP {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// QEMU closed the socket.
    #[error("QMP {what}: QEMU closed the socket")]
    Closed {
        /// What was being waited for.
        what: String,
    },
    /// A line is not a JSON object QMP sends.
    #[error("QMP: cannot read {line:?}: {why}")]
    Malformed {
        /// The line.
        line: String,
        /// Why.
        why: String,
    },
    /// A message came where another was expected (a reply before the
    /// greeting, say).
    #[error("QMP {what}: unexpected {message:?}")]
    Unexpected {
        /// What was being waited for.
        what: String,
        /// What came.
        message: String,
    },
    /// QEMU answered a command with an error.
    #[error("QMP {command}: {class}: {desc}")]
    Command {
        /// The command.
        command: String,
        /// QEMU's error class (`CommandNotFound`, `GenericError`, ...).
        class: String,
        /// QEMU's description.
        desc: String,
    },
}

/// One message from QEMU.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// The greeting: QEMU's version (`major.minor.micro`, and the package
    /// when it names one).
    Greeting {
        /// For instance `7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)`.
        version: String,
    },
    /// A command's success and its value.
    Return(Value),
    /// A command's failure.
    Error {
        /// The error class.
        class: String,
        /// The description.
        desc: String,
    },
    /// An asynchronous event, by name (`SHUTDOWN`, `STOP`, ...).
    Event(String),
}

/// Parses one line QEMU sent.
pub fn parse(line: &str) -> Result<Message, QmpError> {
    let malformed = |why: &str| QmpError::Malformed {
        line: line.trim_end().to_string(),
        why: why.to_string(),
    };
    let value: Value = serde_json::from_str(line).map_err(|e| malformed(&e.to_string()))?;
    let object = value
        .as_object()
        .ok_or_else(|| malformed("not an object"))?;
    if let Some(greeting) = object.get("QMP") {
        let v = &greeting["version"]["qemu"];
        let (Some(major), Some(minor), Some(micro)) = (
            v["major"].as_u64(),
            v["minor"].as_u64(),
            v["micro"].as_u64(),
        ) else {
            return Err(malformed("a greeting without a version"));
        };
        let mut version = format!("{major}.{minor}.{micro}");
        if let Some(package) = greeting["version"]["package"]
            .as_str()
            .filter(|p| !p.is_empty())
        {
            version.push_str(&format!(" ({})", package.trim()));
        }
        return Ok(Message::Greeting { version });
    }
    if let Some(value) = object.get("return") {
        return Ok(Message::Return(value.clone()));
    }
    if let Some(error) = object.get("error") {
        let text = |key: &str| error[key].as_str().unwrap_or("").to_string();
        return Ok(Message::Error {
            class: text("class"),
            desc: text("desc"),
        });
    }
    if let Some(event) = object.get("event").and_then(Value::as_str) {
        return Ok(Message::Event(event.to_string()));
    }
    Err(malformed("neither a greeting, a reply nor an event"))
}

/// The line that runs `command` (no arguments).
pub fn command_line(command: &str) -> String {
    format!("{}\n", serde_json::json!({ "execute": command }))
}

/// A QMP connection, past its greeting.
#[derive(Debug)]
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// QEMU's version, from the greeting.
    pub version: String,
}

impl Qmp {
    /// Reads the greeting on `stream`, waiting up to `greeting_timeout`
    /// (QEMU greets once it has preallocated guest RAM), then negotiates
    /// (`qmp_capabilities`); later reads wait up to `reply_timeout`.
    pub fn handshake(
        stream: UnixStream,
        greeting_timeout: Duration,
        reply_timeout: Duration,
    ) -> Result<Qmp, QmpError> {
        let io = |what: &str| {
            let what = what.to_string();
            move |source| QmpError::Io { what, source }
        };
        let writer = stream.try_clone().map_err(io("clone the socket"))?;
        stream
            .set_read_timeout(Some(greeting_timeout))
            .map_err(io("set a timeout"))?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream),
            writer,
            version: String::new(),
        };
        match qmp.read("the greeting")? {
            Message::Greeting { version } => qmp.version = version,
            other => {
                return Err(QmpError::Unexpected {
                    what: "the greeting".into(),
                    message: format!("{other:?}"),
                })
            }
        }
        qmp.reader
            .get_ref()
            .set_read_timeout(Some(reply_timeout))
            .map_err(io("set a timeout"))?;
        qmp.execute("qmp_capabilities")?;
        Ok(qmp)
    }

    /// Reads the next message.
    fn read(&mut self, what: &str) -> Result<Message, QmpError> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|source| QmpError::Io {
                what: format!("waiting for {what}"),
                source,
            })?;
        if n == 0 {
            return Err(QmpError::Closed {
                what: format!("waiting for {what}"),
            });
        }
        parse(&line)
    }

    /// Sends `command` without waiting for its reply (QMP `quit`: the clock
    /// runs until QEMU exits, not until it answers).
    pub fn send(&mut self, command: &str) -> Result<(), QmpError> {
        self.writer
            .write_all(command_line(command).as_bytes())
            .map_err(|source| QmpError::Io {
                what: format!("send {command}"),
                source,
            })
    }

    /// The reply to a command sent: its return value, events before it
    /// skipped.
    pub fn reply(&mut self, command: &str) -> Result<Value, QmpError> {
        loop {
            match self.read(&format!("the reply to {command}"))? {
                Message::Return(value) => return Ok(value),
                Message::Error { class, desc } => {
                    return Err(QmpError::Command {
                        command: command.to_string(),
                        class,
                        desc,
                    })
                }
                Message::Event(_) => continue,
                Message::Greeting { .. } => {
                    return Err(QmpError::Unexpected {
                        what: format!("the reply to {command}"),
                        message: "a second greeting".into(),
                    })
                }
            }
        }
    }

    /// Runs `command` and returns its value.
    pub fn execute(&mut self, command: &str) -> Result<Value, QmpError> {
        self.send(command)?;
        self.reply(command)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines captured from QEMU 7.2 (Debian 1:7.2+dfsg-7+deb12u18+b3) on this
    // project's machines: a paused q35 guest, quit through QMP.
    const GREETING: &str = "{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 22, \"minor\": 2, \
        \"major\": 7}, \"package\": \"Debian 1:7.2+dfsg-7+deb12u18+b3\"}, \
        \"capabilities\": [\"oob\"]}}\r\n";
    const BEFORE_CAPABILITIES: &str = "{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \
        \"Expecting capabilities negotiation with 'qmp_capabilities'\"}}\r\n";
    const EMPTY_RETURN: &str = "{\"return\": {}}\r\n";
    const NOT_FOUND: &str = "{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \
        \"The command nonexistent has not been found\"}}\r\n";
    const STATUS: &str =
        "{\"return\": {\"status\": \"prelaunch\", \"singlestep\": false, \"running\": false}}\r\n";
    const SHUTDOWN: &str = "{\"timestamp\": {\"seconds\": 1796126153, \"microseconds\": \
        519791}, \"event\": \"SHUTDOWN\", \"data\": {\"guest\": false, \"reason\": \
        \"host-qmp-quit\"}}\r\n";

    #[test]
    fn qemu_lines_are_parsed() {
        assert_eq!(
            parse(GREETING).unwrap(),
            Message::Greeting {
                version: "7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)".into()
            }
        );
        assert_eq!(
            parse(EMPTY_RETURN).unwrap(),
            Message::Return(serde_json::json!({}))
        );
        let Message::Return(status) = parse(STATUS).unwrap() else {
            panic!("not a return");
        };
        assert_eq!(status["status"], "prelaunch");
        assert_eq!(status["running"], false);
        assert_eq!(
            parse(NOT_FOUND).unwrap(),
            Message::Error {
                class: "CommandNotFound".into(),
                desc: "The command nonexistent has not been found".into()
            }
        );
        assert!(matches!(
            parse(BEFORE_CAPABILITIES).unwrap(),
            Message::Error { .. }
        ));
        assert_eq!(parse(SHUTDOWN).unwrap(), Message::Event("SHUTDOWN".into()));
    }

    #[test]
    fn what_qmp_does_not_send_is_refused() {
        for bad in [
            "",
            "not json",
            "[1, 2]",
            "{\"hello\": 1}",
            "{\"QMP\": {\"version\": {}}}",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(matches!(e, QmpError::Malformed { .. }), "{bad:?}: {e}");
        }
    }

    #[test]
    fn commands_are_one_json_line() {
        assert_eq!(command_line("quit"), "{\"execute\":\"quit\"}\n");
    }

    /// A fake QEMU at the other end of a socket pair: it writes `lines`
    /// after reading one line per `|` in them.
    fn fake(script: &'static [&'static str]) -> UnixStream {
        let (ours, theirs) = UnixStream::pair().unwrap();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(theirs.try_clone().unwrap());
            let mut theirs = theirs;
            for step in script {
                if let Some(reply) = step.strip_prefix('|') {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    theirs.write_all(reply.as_bytes()).unwrap();
                } else {
                    theirs.write_all(step.as_bytes()).unwrap();
                }
            }
        });
        ours
    }

    #[test]
    fn a_conversation_skips_events_and_reports_errors() {
        static SCRIPT: [&str; 5] = [
            GREETING,
            concat!("|", "{\"return\": {}}\r\n"),
            concat!(
                "|",
                "{\"event\": \"STOP\"}\r\n{\"return\": {\"status\": \"prelaunch\"}}\r\n"
            ),
            concat!(
                "|",
                "{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"no such\"}}\r\n"
            ),
            "",
        ];
        let t = Duration::from_secs(5);
        let mut qmp = Qmp::handshake(fake(&SCRIPT), t, t).unwrap();
        assert!(qmp.version.starts_with("7.2.22"), "{}", qmp.version);
        assert_eq!(qmp.execute("query-status").unwrap()["status"], "prelaunch");
        let e = qmp.execute("nonexistent").unwrap_err().to_string();
        assert_eq!(e, "QMP nonexistent: CommandNotFound: no such");
        // The fake has gone: the write or the read says so.
        let e = qmp.execute("query-status").unwrap_err();
        assert!(
            matches!(e, QmpError::Closed { .. } | QmpError::Io { .. }),
            "{e}"
        );
    }

    #[test]
    fn a_reply_before_the_greeting_is_refused() {
        static SCRIPT: [&str; 1] = [EMPTY_RETURN];
        let t = Duration::from_secs(5);
        let e = Qmp::handshake(fake(&SCRIPT), t, t).unwrap_err();
        assert!(matches!(e, QmpError::Unexpected { .. }), "{e}");
    }
}

//! What the server's tests share: temp dirs, a fake VMM at the other end of
//! the channel that waits on the wake `EventFd` like the real one, and a
//! server set up in front of it.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use serde_json::{json, Value};
use vmm_sys_util::eventfd::EventFd;

use super::{ApiServer, ApiServerError, ServerLimits};
use crate::api::action::{
    ActionResult, ApiRequest, ReclaimMode, VmmAction, VmmActionError, VmmData,
};
use crate::config::MachineConfig;
use teravm_client::http::{self as client, Connection};

static DIRS: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory, removed on drop.
pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    pub(super) fn new() -> TempDir {
        let n = DIRS.fetch_add(1, Ordering::SeqCst);
        let p = std::env::temp_dir().join(format!("teravm-api-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub(super) fn sock(&self) -> PathBuf {
        self.0.join("api.sock")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The canned answer of the fake VMM to each action.
pub(super) fn answer(action: &VmmAction) -> ActionResult {
    match action {
        VmmAction::GetInstanceInfo => {
            Ok(VmmData::Json(json!({"id": "fake", "state": "Not started"})))
        }
        VmmAction::GetMachineConfig => Ok(VmmData::Json(
            serde_json::to_value(MachineConfig::default()).unwrap(),
        )),
        VmmAction::PutReclaim(c) => Ok(VmmData::Json(serde_json::to_value(c).unwrap())),
        VmmAction::SendCtrlAltDel => Err(VmmActionError::BadRequest(
            "the guest is not running".into(),
        )),
        VmmAction::Shutdown(ReclaimMode::Async) => {
            Ok(VmmData::Accepted(json!({"state": "reclaiming"})))
        }
        VmmAction::Shutdown(ReclaimMode::Sync) => Ok(VmmData::Json(json!({"freed_bytes": 0}))),
        VmmAction::GetVmConfig => Err(VmmActionError::Internal("config lost".into())),
        _ => Ok(VmmData::Empty),
    }
}

/// A fake VMM thread: blocks on the wake event, then answers every request
/// in the channel.
pub(super) struct FakeVmm {
    wake: EventFd,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<VmmAction>>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeVmm {
    pub(super) fn start(rx: Receiver<ApiRequest>, wake: &EventFd) -> FakeVmm {
        let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::default());
        let (stop2, seen2): (_, Arc<Mutex<Vec<VmmAction>>>) =
            (Arc::clone(&stop), Arc::clone(&seen));
        let wake2 = wake.try_clone().unwrap();
        let thread = thread::spawn(move || loop {
            wake2.read().unwrap();
            if stop2.load(Ordering::SeqCst) {
                return;
            }
            while let Ok(req) = rx.try_recv() {
                seen2.lock().unwrap().push(req.action.clone());
                let _ = req.reply.send(answer(&req.action));
            }
        });
        FakeVmm {
            wake: wake.try_clone().unwrap(),
            stop,
            seen,
            thread: Some(thread),
        }
    }

    pub(super) fn seen(&self) -> Vec<VmmAction> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for FakeVmm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.wake.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A server on a fresh socket with a fake VMM behind it.
pub(super) struct Setup {
    pub(super) server: ApiServer,
    pub(super) vmm: FakeVmm,
    pub(super) _dir: TempDir,
}

impl Setup {
    pub(super) fn new() -> Setup {
        Setup::with_limits(ServerLimits::default())
    }
    pub(super) fn with_limits(limits: ServerLimits) -> Setup {
        let dir = TempDir::new();
        let (tx, rx) = mpsc::channel();
        let wake = EventFd::new(0).unwrap();
        let vmm = FakeVmm::start(rx, &wake);
        let server = ApiServer::start_with_limits(&dir.sock(), tx, wake, limits).unwrap();
        Setup {
            server,
            vmm,
            _dir: dir,
        }
    }
    pub(super) fn sock(&self) -> &Path {
        self.server.path()
    }
    pub(super) fn conn(&self) -> Connection {
        Connection::open(self.sock()).unwrap()
    }
}

pub(super) fn fault(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{body}: {e}"));
    v["fault_message"].as_str().unwrap().to_string()
}

/// Sends raw bytes on a new connection and reads one reply.
pub(super) fn raw(s: &Setup, bytes: &[u8]) -> client::Reply {
    let mut c = s.conn();
    c.send_raw(bytes).unwrap();
    c.read_reply().unwrap()
}

/// A server at `path` whose VMM never answers.
pub(super) fn start_at(path: &Path) -> Result<ApiServer, ApiServerError> {
    let (tx, _rx) = mpsc::channel();
    ApiServer::start(path, tx, EventFd::new(0).unwrap())
}

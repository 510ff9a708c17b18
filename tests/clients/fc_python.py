"""Drives teravm with PyPI's firecracker-python 0.0.5 (run by
tests/firecracker_clients.rs in the venv that tests/clients/setup.sh makes).

Usage: fc_python.py TERAVM_BINARY WORK_DIR

Launches teravm with the package's own ProcessManager (pointed at teravm's
binary, with the arguments MicroVM._run_firecracker passes), configures and
starts the microVM with its Api class over the real socket, checks what
teravm refuses, stops the guest with SendCtrlAltDel and reaps the process.
Prints one JSON object with what it saw; exits non-zero on any surprise.
"""

import json
import os
import sys
import time

from firecracker.api import Api
from firecracker.exceptions import APIError, ProcessError
from firecracker.process import ProcessManager


def wait_for(what, check, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def refused(call):
    try:
        call()
    except APIError as e:
        return str(e)
    raise SystemExit("teravm accepted a request it should refuse")


def main():
    binary, work = sys.argv[1], sys.argv[2]
    vm_id = "fcpy-0123abcd"
    os.makedirs(f"{work}/{vm_id}", exist_ok=True)
    sock = f"{work}/{vm_id}/firecracker.socket"
    log = f"{work}/{vm_id}/{vm_id}.log"
    open(log, "w").close()

    pm = ProcessManager()
    pm._config.binary_path = binary
    pm._config.data_path = work
    # MicroVM._run_firecracker's arguments.
    pid = pm.start(vm_id, ["--api-sock", sock, "--id", vm_id, "--log-path", log])
    if not pm.is_running(vm_id):
        raise SystemExit("ProcessManager says teravm is not running")

    api = Api(sock)
    wait_for("the API", lambda: os.path.exists(sock) and api.describe.get().status_code == 200)
    seen = {"pid": pid}
    seen["version"] = api.version.get().json()
    seen["state_before"] = api.describe.get().json()["state"]
    api.logger.put(level="Debug", show_level=True, show_log_origin=False)
    api.machine_config.put(vcpu_count=1, mem_size_mib=256, smt=False, track_dirty_pages=False)
    seen["machine_config"] = api.machine_config.get().json()
    seen["drive_refused"] = refused(
        lambda: api.drive.put(drive_id="rootfs", path_on_host="/rootfs.img",
                              is_root_device=True, is_read_only=False))
    seen["network_refused"] = refused(
        lambda: api.network.put(iface_id="eth0", host_dev_name="tap0"))
    api.boot.put(boot_args="touch=32 then=idle")
    api.actions.put(action_type="InstanceStart")
    seen["state_running"] = wait_for(
        "Running", lambda: api.describe.get().json()["state"] == "Running" and "Running")
    seen["pause_refused"] = refused(lambda: api.vm.patch(state="Paused"))
    seen["vm_config"] = api.vm_config.get().json()
    api.actions.put(action_type="SendCtrlAltDel")
    api.close()
    _, status = os.waitpid(pid, 0)
    seen["exit_code"] = os.waitstatus_to_exitcode(status)
    try:
        pm.get_pid(vm_id)
        seen["get_pid"] = "found"
    except ProcessError as e:
        seen["get_pid"] = str(e)
    with open(log) as f:
        seen["log_lines"] = f.read().splitlines()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()

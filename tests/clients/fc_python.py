"""Drives teravm with PyPI's firecracker-python 0.0.5 (run by
tests/firecracker_clients.rs in the venv that tests/clients/setup.sh makes).

Usage: fc_python.py TERAVM_BINARY WORK_DIR [devices]

Launches teravm with the package's own ProcessManager (pointed at teravm's
binary, with the arguments MicroVM._run_firecracker passes), configures and
starts the microVM with its Api class over the real socket, checks what
teravm refuses, stops the guest with SendCtrlAltDel and reaps the process.
Prints one JSON object with what it saw; exits non-zero on any surprise.

With `devices` (run inside a network namespace holding the tap
`tap_<id>`, as the package names it): configures the microVM as
MicroVM.create does, in its order and with its bodies (boot source, the
root drive `rootfs`, machine-config, the network interface, the vsock at
<data_path>/<id>/v.sock), starts it, waits for the firmware's lines in the
stdout file ProcessManager gives it, echoes through the vsock as a host
client of Firecracker's protocol, then stops it with SendCtrlAltDel.
"""

import json
import os
import socket
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


def firmware_lines(path, needle, timeout=60.0):
    """The firmware's lines in teravm's stdout file, once one has needle."""
    def seen():
        with open(path) as f:
            lines = [l for l in f.read().splitlines() if "teravm firmware:" in l]
        return lines if any(needle in l for l in lines) else None
    return wait_for(f"a firmware line with {needle!r}", seen, timeout)


def vsock_echo(uds, port, message):
    """Firecracker's host side: CONNECT <port>, OK <n>, then the bytes."""
    deadline = time.monotonic() + 60.0
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(60.0)
        try:
            s.connect(uds)
            s.sendall(f"CONNECT {port}\n".encode())
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = s.recv(1)
                if not chunk:
                    break
                reply += chunk
            if reply.startswith(b"OK "):
                break
        except OSError:
            pass
        s.close()
        if time.monotonic() > deadline:
            raise SystemExit("no OK from the vsock")
        time.sleep(0.05)
    s.sendall(message.encode())
    back = b""
    while len(back) < len(message):
        chunk = s.recv(len(message) - len(back))
        if not chunk:
            break
        back += chunk
    s.close()
    return {"ok": reply.decode().strip(), "echoed": back.decode()}


def devices(binary, work):
    # generate_id's shape: 8 lowercase letters and digits.
    vm_id = "fcpy0123"
    os.makedirs(f"{work}/{vm_id}", exist_ok=True)
    sock = f"{work}/{vm_id}/firecracker.socket"
    log = f"{work}/{vm_id}/{vm_id}.log"
    stdout = f"{work}/{vm_id}/firecracker.log"
    uds = f"{work}/{vm_id}/v.sock"
    rootfs = f"{work}/rootfs.img"
    with open(rootfs, "wb") as f:
        f.write(b"fc-python rootfs" + bytes((1 << 20) - 16))
    open(log, "w").close()

    pm = ProcessManager()
    pm._config.binary_path = binary
    pm._config.data_path = work
    pid = pm.start(vm_id, ["--api-sock", sock, "--id", vm_id, "--log-path", log])
    api = Api(sock)
    wait_for("the API", lambda: os.path.exists(sock) and api.describe.get().status_code == 200)
    seen = {"pid": pid}
    api.logger.put(level="Debug", show_level=True, show_log_origin=False)
    # MicroVM.create: _configure_vmm_boot_source (kernel_image_path left
    # out: the firmware boots), _configure_vmm_root_drive,
    # _configure_vmm_resources, _configure_vmm_network, _configure_vmm_vsock.
    api.boot.put(boot_args="blk vsock=echo:52 net=echo then=idle")
    api.drive.put(drive_id="rootfs", path_on_host=rootfs,
                  is_root_device=True, is_read_only=False)
    api.machine_config.put(vcpu_count=1, mem_size_mib=256)
    # get_interface_name is the host's default-route interface ("eth0"
    # here); host_dev_name is tap_<id>; no guest_mac, no rate limiters.
    api.network.put(iface_id="eth0", host_dev_name=f"tap_{vm_id}")
    api.vsock.put(guest_cid=3, uds_path=uds)
    seen["vm_config"] = api.vm_config.get().json()
    api.actions.put(action_type="InstanceStart")
    seen["state_running"] = wait_for(
        "Running", lambda: api.describe.get().json()["state"] == "Running" and "Running")
    firmware_lines(stdout, "net sent hello")
    seen["vsock"] = vsock_echo(uds, 52, "fc-python over vsock\n")
    seen["firmware"] = firmware_lines(stdout, "vsock echo")
    api.actions.put(action_type="SendCtrlAltDel")
    api.close()
    _, status = os.waitpid(pid, 0)
    seen["exit_code"] = os.waitstatus_to_exitcode(status)
    with open(rootfs, "rb") as f:
        seen["rootfs_sector1"] = f.read(1024)[512:].hex()[:8]
    with open(log) as f:
        seen["log_lines"] = f.read().splitlines()
    print(json.dumps(seen))


def main():
    binary, work = sys.argv[1], sys.argv[2]
    if sys.argv[3:] == ["devices"]:
        return devices(binary, work)
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
    # Pause and resume (PATCH /vm, taken since issue 26), as the package's
    # vm.patch sends them.
    api.vm.patch(state="Paused")
    seen["state_paused"] = api.describe.get().json()["state"]
    api.vm.patch(state="Resumed")
    seen["state_resumed"] = api.describe.get().json()["state"]
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

#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Host side of tests/guest/host/run-unplug.sh, once the guest printed UNPLUG-READY.

Usage: unplug-host.py QMP_SOCKET CTL_SOCKET DELETE_WAIT [ID]

1. device_del ID (cxlacc0, default, or in bar mode cxlacc0-bar: either
   function takes the whole slot) through QMP and wait (DELETE_WAIT seconds)
   for DEVICE_DELETED of every function of the slot: cxlacc0 (shmem mode,
   one function) or cxlacc0 and cxlacc0-bar (bar mode); query-pci must list
   none of them, and still list device 1's.
2. chardev-remove cxlacc0-sock and, in bar mode, object-del cxlacc0-mem:
   what is left of device 0 on the host side (device_del leaves the
   vhost-user connection open).
3. Daemon 0 (its log is next to its socket in ci/run-guest.sh's work
   directory) ends its session cleanly ("front-end disconnected", no error,
   no panic) and accepts the next front-end; daemon 1 keeps its session.
4. "GO" on CTL_SOCKET (the guest's ttyS1) lets the guest go on.

One "RESULT host_<name> PASS|FAIL <detail>" line per check; exit status 1
when one failed.
"""
import json
import os
import select
import socket
import sys
import time


class Qmp:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.buf = b""
        self.events = []
        self.read()  # greeting
        self.cmd("qmp_capabilities")

    def read(self, timeout=None):
        """The next message, or None after timeout seconds."""
        while b"\n" not in self.buf:
            if not select.select([self.sock], [], [], timeout)[0]:
                return None
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("QMP connection closed")
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        msg = json.loads(line)
        if "event" in msg:
            self.events.append(msg)
        return msg

    def cmd(self, name, **args):
        self.sock.sendall(json.dumps({"execute": name, "arguments": args}).encode() + b"\n")
        while True:
            msg = self.read()
            if "return" in msg or "error" in msg:
                return msg

    def wait_deleted(self, ids, secs):
        """DEVICE_DELETED of every id within secs; returns the ids missing."""
        left, end = set(ids), time.time() + secs
        while True:
            for e in self.events:
                if e["event"] == "DEVICE_DELETED":
                    left.discard(e["data"].get("device"))
            self.events.clear()
            if not left or time.time() >= end:
                return left
            self.read(timeout=max(0.0, end - time.time()))

    def pci_ids(self):
        def walk(devices):
            for d in devices:
                yield d.get("qdev_id")
                yield from walk(d.get("pci_bridge", {}).get("devices", []))

        ans = self.cmd("query-pci")["return"]
        return {i for bus in ans for i in walk(bus["devices"]) if i}


FAILS = 0


def result(name, ok, detail):
    global FAILS
    print(f"RESULT host_{name} {'PASS' if ok else 'FAIL'} {detail}", flush=True)
    FAILS += not ok


def log_since(path, offset):
    try:
        with open(path, errors="replace") as f:
            return f.read()[offset:]
    except OSError:
        return ""


def wait_for(cond, secs):
    end = time.time() + secs
    while not cond() and time.time() < end:
        time.sleep(0.1)
    return cond()


def main():
    qmp_path, delete_wait = sys.argv[1], float(sys.argv[3])
    target = sys.argv[4] if len(sys.argv) > 4 else "cxlacc0"
    qmp = Qmp(qmp_path)

    # the daemons' logs are next to their sockets (run-guest.sh's work dir). QEMU
    # names the address the daemon bound, in the private directory (.cxlPID-N) in
    # which it makes its socket before moving it into place.
    work = ""
    for c in qmp.cmd("query-chardev")["return"]:
        if c["label"] == "cxlacc0-sock" and "unix:" in c["filename"]:
            work = os.path.dirname(c["filename"].split("unix:", 1)[1].split(",")[0])
            # the daemon binds in a private directory beside the socket and
            # renames the socket into place: the address names that directory
            if os.path.basename(work).startswith(".cxl"):
                work = os.path.dirname(work)
    log0, log1 = os.path.join(work, "daemon0.log"), os.path.join(work, "daemon1.log")
    at0, at1 = len(log_since(log0, 0)), len(log_since(log1, 0))

    # 1. one function of the slot: QEMU asks the guest (ACPI PCI hotplug on
    # q35's root ports, or native PCIe hotplug), which removes every
    # function and ejects (powers off) the slot
    before = qmp.pci_ids()
    funcs0 = {i for i in before if i in ("cxlacc0", "cxlacc0-bar")}
    funcs1 = {i for i in before if i in ("cxlacc1", "cxlacc1-bar")}
    t0 = time.time()
    ans = qmp.cmd("device_del", id=target)
    left = qmp.wait_deleted(funcs0, delete_wait) if "return" in ans else {"*"}
    took = time.time() - t0
    ids = qmp.pci_ids()
    ok = "cxlacc0" in funcs0 and not left and not funcs0 & ids and funcs1 <= ids
    result("device_del", ok,
           f"DEVICE_DELETED for {' and '.join(sorted(funcs0))} {took:.1f} s after device_del {target}; "
           f"PCI devices now: {' '.join(sorted(ids))}" if ok else
           f"device_del answered {ans}, no DEVICE_DELETED for {sorted(left)} within "
           f"{delete_wait:.0f} s; PCI devices: {' '.join(sorted(ids))}")
    time.sleep(0.5)
    after_del = log_since(log0, at0).strip()
    print("daemon 0 after device_del:", after_del.replace("\n", " | ") or "(nothing logged)",
          flush=True)

    # 2. the rest of device 0 on the host side
    r1 = qmp.cmd("chardev-remove", id="cxlacc0-sock")
    # bar mode only: in shmem mode QEMU got the memory from the daemon
    objects = {o["name"] for o in qmp.cmd("qom-list", path="/objects")["return"]}
    r2 = qmp.cmd("object-del", id="cxlacc0-mem") if "cxlacc0-mem" in objects else {"return": {}}
    ok = "return" in r1 and "return" in r2
    what = " and memory backend cxlacc0-mem" if "cxlacc0-mem" in objects else ""
    result("backend_removed", ok,
           f"chardev cxlacc0-sock{what} removed" if ok else
           f"chardev-remove: {r1}; object-del: {r2}")

    # 3. daemon 0: clean end of the session, then the next front-end is
    # served (we connect and hang up); daemon 1: still in its session
    wait_for(lambda: "front-end disconnected" in log_since(log0, at0), 10)
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(os.path.join(work, "cxl0.sock"))
        connected = "yes"
    except OSError as e:
        connected = str(e)
    wait_for(lambda: "front-end connected" in log_since(log0, at0), 5)
    probe.close()
    d0, d1 = log_since(log0, at0), log_since(log1, at1)
    bad = [ln for ln in (d0 + d1).splitlines()
           if any(w in ln for w in ("panicked", "session ended:", "ERROR"))]
    ok = (bool(work) and "front-end disconnected" in d0 and connected == "yes"
          and "front-end connected" in d0 and "disconnected" not in d1 and not bad)
    result("daemon", ok,
           "daemon 0 ended its session when the chardev went (front-end disconnected), "
           "then accepted the next front-end; daemon 1 kept its session" if ok else
           f"work dir {work!r}, probe connect {connected}; daemon 0: {d0.strip()!r}; "
           f"daemon 1: {d1.strip()!r}")
    print("daemon 0 log from device_del on:", flush=True)
    for line in d0.splitlines():
        print("  " + line, flush=True)



def go(ctl_path):
    """4. the guest goes on"""
    ctl = socket.socket(socket.AF_UNIX)
    ctl.connect(ctl_path)
    ctl.sendall(b"GO\n")
    time.sleep(0.2)
    ctl.close()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a dead QEMU, a broken answer: a failure, not a hang
        result("qmp", False, f"{type(e).__name__}: {e}")
    finally:
        try:
            go(sys.argv[2])
        except OSError as e:
            result("go", False, f"cannot tell the guest to go on: {e}")
    sys.exit(1 if FAILS else 0)

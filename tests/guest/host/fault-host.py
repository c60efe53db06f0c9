#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Host side of tests/guest/host/run-faults.sh: runs the guest's control requests.

Usage: fault-host.py CONSOLE SERIAL_SOCKET DAEMON CONTROL_DIR [PID]

The guest program (tests/guest/progs/fault-tests.c) prints requests on its console

    CXLA-CTL <seq> <device index> <ctl arguments>[; <ctl arguments>...] CXLA-END

This script follows the console file (ci/run-guest.sh --console), runs each
command as "DAEMON ctl --control-socket CONTROL_DIR/ctl<index>.sock --json
ARGS" (one at a time, in order; the first failure ends the list) and answers
on the guest's second serial port (a QEMU socket chardev, SERIAL_SOCKET)

    CXLA-ACK <seq> <exit code> <JSON reply of the last command>

A request seen again (the guest repeats it when no answer came) gets the
same answer without running again. Host actions besides ctl: "!kill-worker"
SIGKILLs the worker of a --supervise daemon and waits for the next one (its
"info" is the reply). Ends when the console has the guest's end marker or
process PID is gone. Logs one line per request on stdout.
"""
import json
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import time

REQ = re.compile(r"CXLA-CTL (\d+) (\d+) (.*) CXLA-END\s*$")
DONE = "CXL-ACCEL-GUEST-DONE"


def log(msg):
    print(f"fault-host: {msg}", flush=True)


class Host:
    def __init__(self, daemon, ctl_dir):
        self.daemon = daemon
        self.ctl_dir = ctl_dir

    def ctl(self, index, args, timeout=60):
        """(exit code, one-line JSON) of one cxl-accel ctl command."""
        sock = os.path.join(self.ctl_dir, f"ctl{index}.sock")
        try:
            p = subprocess.run([self.daemon, "ctl", "--control-socket", sock, "--json"] + args,
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return 124, json.dumps({"error": f"ctl {' '.join(args)} timed out"})
        out = p.stdout.strip().splitlines()
        text = out[-1] if out else json.dumps({"error": p.stderr.strip() or "no output"})
        return p.returncode, text

    def kill_worker(self, index):
        rc, text = self.ctl(index, ["info"])
        if rc:
            return rc, text
        pid = json.loads(text)["pid"]
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError as e:
            return 1, json.dumps({"error": f"kill {pid}: {e}"})
        end = time.time() + 30
        while time.time() < end:
            rc, text = self.ctl(index, ["info"], timeout=30)
            if rc == 0 and json.loads(text).get("pid") not in (None, pid):
                log(f"device {index}: worker {pid} killed, {json.loads(text)['pid']} serves now")
                return 0, text
            time.sleep(0.2)
        return 1, json.dumps({"error": f"no new worker after killing {pid}"})

    def run(self, index, cmds):
        rc, text = 0, "{}"
        for cmd in cmds.split(";"):
            args = shlex.split(cmd)
            if not args:
                continue
            if args == ["!kill-worker"]:
                rc, text = self.kill_worker(index)
            else:
                rc, text = self.ctl(index, args)
            if rc:
                break
        return rc, text


def connect(path, deadline):
    while True:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
            return s
        except OSError:
            s.close()
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def main():
    console, serial_path, daemon, ctl_dir = sys.argv[1:5]
    parent = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    host = Host(daemon, ctl_dir)
    ser = connect(serial_path, time.time() + 300)
    answers = {}
    pos, partial, served = 0, "", 0
    while True:
        # whatever the guest sends on ttyS1 is not for us
        while select.select([ser], [], [], 0)[0]:
            if not ser.recv(4096):
                log("serial port closed")
                return 0
        try:
            with open(console, errors="replace") as f:
                f.seek(pos)
                data = f.read()
                pos = f.tell()
        except OSError:
            data = ""
        lines = (partial + data).split("\n")
        partial = lines.pop()
        for line in lines:
            if DONE in line:
                log(f"guest done, {served} requests served")
                return 0
            m = REQ.search(line.replace("\r", ""))
            if not m:
                continue
            seq, index, cmds = int(m.group(1)), int(m.group(2)), m.group(3)
            if seq in answers:
                log(f"#{seq} again: answered before")
            else:
                t0 = time.time()
                rc, text = host.run(index, cmds)
                answers[seq] = f"CXLA-ACK {seq} {rc} {text}\n"
                served += 1
                log(f"#{seq} device {index}: {cmds} -> {rc} ({time.time() - t0:.2f} s)"
                    f"{'' if rc == 0 else ': ' + text[:300]}")
            ser.sendall(answers[seq].encode())
        if parent and not os.path.exists(f"/proc/{parent}"):
            log(f"run-guest is gone, {served} requests served")
            return 0
        if not data:
            time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())

// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `--print-qemu-args`: the QEMU arguments that attach this device as the command line
//! configures it (guest RAM, NUMA nodes, the vhost-user or vfio-user function, the CXL
//! topology), and their shell-pasteable rendering.

use crate::cli::{parse_size, qemu_size, Args, ArgsError, SocketMode};
use crate::device::Attach;
use crate::protocol::Config;

/// QEMU's option syntax doubles commas inside values.
fn qemu_escape(path: &std::path::Path) -> String {
    path.display().to_string().replace(',', ",,")
}

/// Quotes a word for a POSIX shell when it needs it.
fn shell_quote(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || ",./=_-:+@".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The QEMU arguments that attach this device, as (option, value) pairs.
pub fn qemu_args(args: &Args) -> Result<Vec<(String, String)>, ArgsError> {
    let Some(socket_path) = &args.socket_path else {
        return Err(ArgsError::NoSocketPath);
    };
    let n = args.index;
    let slot = 0x10 + n;
    let mut v = Vec::new();
    if args.guest_ram == "none" && args.ram_node.is_some() {
        return Err(ArgsError::RamNode);
    }
    if args.guest_ram != "none" {
        let ram = parse_size(&args.guest_ram)?;
        v.push((
            "-object".into(),
            format!(
                "memory-backend-memfd,id=cxl-guest-ram,size={},share=on",
                qemu_size(ram)
            ),
        ));
        match (args.attach, &args.ram_node) {
            (Attach::Bar | Attach::Shmem, Some(node)) => {
                // With NUMA nodes, RAM is the sum of the nodes' backends.
                let size = parse_size(node)?;
                v.push((
                    "-object".into(),
                    format!(
                        "memory-backend-memfd,id=cxl-ram-node,size={},share=on",
                        qemu_size(size)
                    ),
                ));
                v.push(("-m".into(), qemu_size(ram + size)));
                v.push(("-machine".into(), "q35".into()));
                v.push(("-numa".into(), "node,nodeid=0,memdev=cxl-guest-ram".into()));
                v.push(("-numa".into(), "node,nodeid=1,memdev=cxl-ram-node".into()));
            }
            (_, Some(_)) => return Err(ArgsError::RamNode),
            (Attach::Bar | Attach::Shmem, None) => {
                v.push(("-m".into(), qemu_size(ram)));
                v.push(("-machine".into(), "q35,memory-backend=cxl-guest-ram".into()));
            }
            (Attach::Cxl, None) => {
                v.push(("-m".into(), qemu_size(ram)));
                v.push((
                    "-machine".into(),
                    "q35,cxl=on,memory-backend=cxl-guest-ram".into(),
                ));
                v.push(("-M".into(), cxl_windows(args.cxl_host_bridges)));
            }
            (Attach::Numa, None) => {
                // With NUMA nodes, RAM is the sum of the nodes: this covers guest RAM and
                // this device; with more NUMA-mode devices, -m must be raised to the total.
                v.push(("-m".into(), qemu_size(ram + args.memory_size)));
                v.push(("-machine".into(), "q35".into()));
                v.push(("-numa".into(), "node,nodeid=0,memdev=cxl-guest-ram".into()));
            }
        }
    }
    if args.attach == Attach::Cxl {
        cxl_qemu_args(args, socket_path, &mut v);
        return Ok(v);
    }
    let reconnect = match (args.socket_mode, args.reconnect_ms) {
        // QEMU listens and waits for the daemon before starting the guest.
        (SocketMode::Client, _) => ",server=on,wait=on".to_string(),
        (SocketMode::Server, 0) => String::new(),
        (SocketMode::Server, ms) => format!(",reconnect-ms={ms}"),
    };
    v.push((
        "-chardev".into(),
        format!(
            "socket,id=cxlacc{n}-sock,path={}{reconnect}",
            qemu_escape(socket_path)
        ),
    ));
    // In shmem mode the memory is a BAR of this one function (the daemon hands QEMU the
    // file); otherwise a second function or a NUMA node is backed by the file, by path.
    let multifunction = if args.attach == Attach::Bar {
        ",multifunction=on"
    } else {
        ""
    };
    v.push((
        "-device".into(),
        format!(
            "vhost-user-test-device-pci,id=cxlacc{n},chardev=cxlacc{n}-sock,virtio-id={},\
num_vqs={},vq_size={},config_size={},bus=pcie.0,addr={slot:#x}.0{multifunction}",
            args.virtio_id,
            args.cmd_queues + 1,
            args.queue_size,
            std::mem::size_of::<Config>()
        ),
    ));
    if args.attach == Attach::Shmem {
        return Ok(v);
    }
    v.push((
        "-object".into(),
        format!(
            "memory-backend-file,id=cxlacc{n}-mem,mem-path={},size={},share=on",
            qemu_escape(&args.memory_path),
            qemu_size(args.memory_size)
        ),
    ));
    v.push(match args.attach {
        Attach::Numa => (
            "-numa".into(),
            format!("node,nodeid={},memdev=cxlacc{n}-mem", n + 1),
        ),
        _ => (
            "-device".into(),
            format!(
                "ivshmem-plain,id=cxlacc{n}-bar,memdev=cxlacc{n}-mem,bus=pcie.0,addr={slot:#x}.1"
            ),
        ),
    });
    Ok(v)
}

/// CXL host bridge `b`'s PCI bus number: room for the buses of its root ports below it.
fn cxl_bus_nr(b: u32) -> u32 {
    12 + 50 * b
}

/// The CXL windows of host bridges `0..count`, 4 GiB each: one `-M` option, as QEMU
/// refuses the window list spread over several.
fn cxl_windows(count: u32) -> String {
    (0..count)
        .map(|b| format!("cxl-fmw.{b}.targets.0=cxlhb{b},cxl-fmw.{b}.size=4G"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `--attach cxl`: a root port on host bridge `--cxl-host-bridge` and the vfio-user
/// function on it; device N also creates host bridge N (pxb-cxl, with HDM decoders even
/// for one root port), whose window the device printing the machine declares.
fn cxl_qemu_args(args: &Args, socket: &std::path::Path, v: &mut Vec<(String, String)>) {
    let (n, b) = (args.index, args.cxl_host_bridge);
    if n == b {
        v.push((
            "-device".into(),
            format!(
                "pxb-cxl,bus_nr={},bus=pcie.0,id=cxlhb{b},hdm_for_passthrough=on",
                cxl_bus_nr(b)
            ),
        ));
    }
    v.push((
        "-device".into(),
        format!(
            "cxl-rp,port={n},bus=cxlhb{b},id=cxlrp{n},chassis=0,slot={}",
            2 + n
        ),
    ));
    let mut socket_json = serde_json::json!({
        "driver": "vfio-user-pci",
        "id": format!("cxlacc{n}"),
        "bus": format!("cxlrp{n}"),
        "socket": {"type": "unix", "path": socket.to_string_lossy()},
    });
    if args.qemu_cxl_mem_bar {
        socket_json["x-cxl-mem-bar"] = crate::vfio::function::DEVMEM_BAR.into();
    }
    v.push(("-device".into(), socket_json.to_string()));
}

/// Shell-pasteable rendering: one option per line, continued with backslashes.
pub fn render_qemu_args(pairs: &[(String, String)]) -> String {
    let lines: Vec<String> = pairs
        .iter()
        .map(|(o, val)| format!("{o} {}", shell_quote(val)))
        .collect();
    lines.join(" \\\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// Arguments with socket path `s` and memory path `m`, then `more`.
    fn with(more: &[&str]) -> Args {
        let base = ["cxl-accel", "--socket-path", "s", "--memory-path", "m"];
        Args::parse_from(base.iter().chain(more))
    }

    #[test]
    fn qemu_args_name_every_piece() {
        let args = Args::parse_from([
            "cxl-accel",
            "--socket-path",
            "/tmp/a b.sock",
            "--memory-path",
            "/dev/shm/m,1",
            "--index",
            "1",
            "--attach",
            "bar",
        ]);
        let text = render_qemu_args(&qemu_args(&args).unwrap());
        assert!(text.contains("'socket,id=cxlacc1-sock,path=/tmp/a b.sock'"));
        assert!(text.contains("mem-path=/dev/shm/m,,1,size=256M,share=on"));
        assert!(text.contains("virtio-id=21,num_vqs=5,vq_size=256,config_size=64"));
        assert!(text.contains("addr=0x11.0,multifunction=on"));
        assert!(
            text.contains("ivshmem-plain,id=cxlacc1-bar,memdev=cxlacc1-mem,bus=pcie.0,addr=0x11.1")
        );
        assert!(text.contains("memory-backend-memfd,id=cxl-guest-ram,size=1G,share=on"));
        let none = with(&["--guest-ram", "none"]);
        assert!(!render_qemu_args(&qemu_args(&none).unwrap()).contains("memfd"));
        let numa = with(&["--attach", "numa", "--index", "1"]);
        let text = render_qemu_args(&qemu_args(&numa).unwrap());
        assert!(text.contains("-numa node,nodeid=0,memdev=cxl-guest-ram"));
        assert!(text.contains("-numa node,nodeid=2,memdev=cxlacc1-mem"));
        assert!(text.contains("-m 1280M"));
        assert!(!text.contains("ivshmem"));
    }

    #[test]
    fn shmem_is_one_function_and_the_default() {
        let default = with(&[]);
        assert_eq!(default.attach, Attach::Shmem);
        // One default for the command line and the device model.
        assert_eq!(default.attach, Attach::default());
        let text = render_qemu_args(&qemu_args(&default).unwrap());
        assert!(text.contains("bus=pcie.0,addr=0x10.0"));
        assert!(!text.contains("multifunction"));
        assert!(!text.contains("ivshmem"));
        assert!(
            !text.contains("memory-backend-file"),
            "QEMU gets the file from the daemon"
        );
        assert!(text.contains("-machine q35,memory-backend=cxl-guest-ram"));
        // QEMU makes the region a whole BAR, whose size is a power of two.
        let odd = with(&["--memory-size", "96M"]);
        let e = odd.check().unwrap_err().to_string();
        assert!(e.contains("power-of-two") && e.contains("128M"), "{e}");
        let bar = with(&["--memory-size", "96M", "--attach", "bar"]);
        assert!(bar.check().is_ok());
    }

    #[test]
    fn ram_node_is_a_second_numa_node_of_shared_ram() {
        let text = render_qemu_args(&qemu_args(&with(&["--ram-node", "256M"])).unwrap());
        assert!(text.contains("memory-backend-memfd,id=cxl-ram-node,size=256M,share=on"));
        assert!(text.contains("-numa node,nodeid=0,memdev=cxl-guest-ram"));
        assert!(text.contains("-numa node,nodeid=1,memdev=cxl-ram-node"));
        assert!(text.contains("-m 1280M"));
        // NUMA nodes and the machine's own backend exclude each other in QEMU.
        assert!(!text.contains("memory-backend=cxl-guest-ram"));
        for bad in [
            &["--ram-node", "256M", "--attach", "numa"][..],
            &["--ram-node", "256M", "--attach", "cxl"],
            &["--ram-node", "256M", "--guest-ram", "none"],
        ] {
            let e = qemu_args(&with(bad)).unwrap_err().to_string();
            assert!(e.contains("--ram-node"), "{e}");
        }
    }

    #[test]
    fn cxl_topology_for_one_and_two_host_bridges() {
        // Device 0 prints the machine, host bridge 0 with its root port and function.
        let first = with(&["--attach", "cxl", "--cxl-host-bridges", "2"]);
        let text = render_qemu_args(&qemu_args(&first).unwrap());
        assert!(text.contains("-machine q35,cxl=on,memory-backend=cxl-guest-ram"));
        // Every window on one -M: QEMU refuses the list spread over several.
        assert_eq!(text.matches("-M ").count(), 1);
        assert!(text.contains(
            "-M cxl-fmw.0.targets.0=cxlhb0,cxl-fmw.0.size=4G,\
             cxl-fmw.1.targets.0=cxlhb1,cxl-fmw.1.size=4G"
        ));
        assert!(text.contains("pxb-cxl,bus_nr=12,bus=pcie.0,id=cxlhb0,hdm_for_passthrough=on"));
        assert!(text.contains("cxl-rp,port=0,bus=cxlhb0,id=cxlrp0"));
        assert!(text.contains(r#""driver":"vfio-user-pci","id":"cxlacc0""#));
        assert!(text.contains(r#""socket":{"path":"s","type":"unix"}"#));
        assert!(!text.contains("vhost-user") && !text.contains("chardev"));

        // Device 1 under host bridge 0: a second root port, no bridge, no machine.
        let shared = with(&["--attach", "cxl", "--index", "1", "--guest-ram", "none"]);
        let text = render_qemu_args(&qemu_args(&shared).unwrap());
        assert!(!text.contains("pxb-cxl") && !text.contains("-M ") && !text.contains("-machine"));
        assert!(text.contains("cxl-rp,port=1,bus=cxlhb0,id=cxlrp1"));
        assert!(text.contains(r#""bus":"cxlrp1""#));

        // Device 1 under host bridge 1: it creates that bridge, on buses of its own.
        let own = with(&[
            "--attach",
            "cxl",
            "--index",
            "1",
            "--cxl-host-bridge",
            "1",
            "--guest-ram",
            "none",
        ]);
        let text = render_qemu_args(&qemu_args(&own).unwrap());
        assert!(text.contains("pxb-cxl,bus_nr=62,bus=pcie.0,id=cxlhb1"));
        assert!(text.contains("cxl-rp,port=1,bus=cxlhb1,id=cxlrp1"));
        assert!(!text.contains("-M "));

        // A QEMU with qemu/patches is told which BAR the region reaches; stock QEMU is not.
        assert!(!text.contains("x-cxl-mem-bar"));
        let patched = with(&["--attach", "cxl", "--qemu-cxl-mem-bar"]);
        let text = render_qemu_args(&qemu_args(&patched).unwrap());
        assert!(text.contains(r#""x-cxl-mem-bar":4"#), "{text}");
        assert_eq!(
            with(&["--attach", "bar", "--qemu-cxl-mem-bar"]).check(),
            Err(ArgsError::CxlMemBar)
        );

        // The memory is a BAR: a power of two; host bridges 0-3.
        assert!(with(&["--attach", "cxl", "--memory-size", "96M"])
            .check()
            .is_err());
        let five = ["cxl-accel", "--socket-path", "s", "--memory-path", "m"]
            .iter()
            .chain(&["--attach", "cxl", "--cxl-host-bridges", "5"]);
        assert!(Args::try_parse_from(five).is_err());
    }
}

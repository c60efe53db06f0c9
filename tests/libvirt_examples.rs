// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The libvirt examples (`libvirt/cxl-accel-one.xml`, `libvirt/cxl-accel-two.xml`) attach
//! each device as the daemon's `--print-qemu-args` says: the same vhost-user chardev and
//! device, the device memory as an ivshmem-plain function of the same size in the same slot
//! and function, shared guest RAM on q35. `ci/libvirt-demo.sh` boots them under libvirt.

mod common;

use std::process::Command;

use common::repo;

/// The daemon's QEMU arguments for device `n` at the examples' placeholders.
fn printed(n: u32) -> Vec<(String, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_cxl-accel"))
        .args(["--socket-path", &format!("@SOCKET{n}@")])
        .args(["--memory-path", &format!("/dev/shm/@SHMEM{n}@")])
        .args(["--memory-size", "256M", "--index", &n.to_string()])
        .args([
            "--guest-ram",
            "none",
            "--attach",
            "bar",
            "--print-qemu-args",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap().replace("\\\n", " ");
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .chunks(2)
        .map(|p| (p[0].to_string(), p[1].to_string()))
        .collect()
}

/// The values of the `<qemu:arg value='...'/>` elements, in order.
fn qemu_args(xml: &str) -> Vec<String> {
    xml.split("<qemu:arg value='")
        .skip(1)
        .map(|s| s.split('\'').next().unwrap().to_string())
        .collect()
}

/// `key=value` of a comma-separated QEMU option string.
fn opt<'a>(s: &'a str, key: &str) -> Option<&'a str> {
    s.split(',')
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
}

fn check(file: &str, devices: u32) {
    let xml = std::fs::read_to_string(repo().join("libvirt").join(file)).unwrap();
    // XML forbids "--" inside a comment; libvirt refuses such a file.
    for comment in xml.split("<!--").skip(1) {
        let text = comment.split("-->").next().unwrap();
        assert!(
            !text.contains("--"),
            "{file}: a comment contains \"--\", which XML forbids: {text}"
        );
    }
    // Without the comments, which explain the placeholders.
    let body: String = xml
        .split("<!--")
        .enumerate()
        .map(|(i, part)| {
            if i == 0 {
                part
            } else {
                part.split_once("-->").unwrap().1
            }
        })
        .collect();
    let body = body.as_str();
    assert!(body.contains("machine='q35'"), "{file}: q35");
    assert!(
        body.contains("<acpi/>"),
        "{file}: ACPI (else libvirt passes -no-acpi)"
    );
    assert!(
        body.contains("<source type='memfd'/>") && body.contains("<access mode='shared'/>"),
        "{file}: guest RAM must be shared memfd for the daemon"
    );
    let args = qemu_args(body);
    for n in 0..devices {
        let printed = printed(n);
        for (o, v) in &printed {
            match (o.as_str(), v.split(',').next().unwrap()) {
                ("-chardev", _) | ("-device", "vhost-user-test-device-pci") => {
                    let i = args.iter().position(|a| a == v).unwrap_or_else(|| {
                        panic!("{file}: no <qemu:arg value='{v}'/> (as --print-qemu-args prints)")
                    });
                    assert_eq!(args[i - 1], *o, "{file}: {v} after {o}");
                }
                ("-object", "memory-backend-file") => {
                    let name = opt(v, "mem-path")
                        .unwrap()
                        .strip_prefix("/dev/shm/")
                        .unwrap();
                    let shmem = body
                        .split(&format!("<shmem name='{name}'>"))
                        .nth(1)
                        .unwrap_or_else(|| panic!("{file}: no <shmem name='{name}'>"))
                        .split("</shmem>")
                        .next()
                        .unwrap();
                    assert!(shmem.contains("<model type='ivshmem-plain'/>"), "{file}");
                    let size = opt(v, "size").unwrap();
                    let (num, unit) = size.split_at(size.len() - 1);
                    assert!(
                        shmem.contains(&format!("<size unit='{unit}'>{num}</size>")),
                        "{file}: {name} must be {size}"
                    );
                }
                ("-device", "ivshmem-plain") => {
                    let (slot, func) = opt(v, "addr").unwrap().split_once('.').unwrap();
                    assert!(
                        body.contains(&format!(
                            "slot='{slot}' function='0x{func}'/>\n    </shmem>"
                        )),
                        "{file}: the device memory of device {n} must be at {slot}.{func}"
                    );
                }
                (o, v) => panic!("{file}: --print-qemu-args printed {o} {v}, unknown here"),
            }
        }
    }
    // No device more than the file says.
    let devs = args
        .iter()
        .filter(|a| a.starts_with("vhost-user-test-device-pci,"))
        .count();
    assert_eq!(devs, devices as usize, "{file}");
}

#[test]
fn one_device_example_matches_the_daemon() {
    check("cxl-accel-one.xml", 1);
}

#[test]
fn two_devices_example_matches_the_daemon() {
    check("cxl-accel-two.xml", 2);
}

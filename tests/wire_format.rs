// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The wire format is defined once in Rust (src/protocol.rs) and once in C
//! (guest-driver/cxl_accel_proto.h) for the driver. This test compiles a C program against
//! the header and checks every constant, record size and field offset against Rust, and
//! that the header defines nothing the Rust side does not know.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use cxl_accel::protocol::{constants, layout};

const HEADER: &str = "guest-driver/cxl_accel_proto.h";

fn c_values() -> BTreeMap<String, u64> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("cxl-accel-wire-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut prog = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"{}\"\nint main(void) {{\n",
        root.join(HEADER).display()
    );
    for (strukt, field, _) in layout() {
        if field.is_empty() {
            prog += &format!("printf(\"{strukt} %zu\\n\", sizeof(struct {strukt}));\n");
        } else {
            prog += &format!(
                "printf(\"{strukt}.{field} %zu\\n\", offsetof(struct {strukt}, {field}));\n"
            );
        }
    }
    for (name, _) in constants() {
        prog += &format!("printf(\"{name} %llu\\n\", (unsigned long long)({name}));\n");
    }
    prog += "return 0;\n}\n";
    let src = dir.join("wire.c");
    let bin = dir.join("wire");
    std::fs::write(&src, prog).unwrap();
    let out = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("a C compiler (cc) is needed for this test");
    assert!(
        out.status.success(),
        "C program failed to compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&bin).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn c_header_matches_rust_definitions() {
    let c = c_values();
    let mut mismatches = Vec::new();
    for (strukt, field, value) in layout() {
        let key = if field.is_empty() {
            strukt.to_string()
        } else {
            format!("{strukt}.{field}")
        };
        if c.get(&key) != Some(&(value as u64)) {
            mismatches.push(format!("{key}: rust {value}, C {:?}", c.get(&key)));
        }
    }
    for (name, value) in constants() {
        if c.get(&name) != Some(&value) {
            mismatches.push(format!("{name}: rust {value}, C {:?}", c.get(&name)));
        }
    }
    assert!(
        mismatches.is_empty(),
        "wire format differs:\n{}",
        mismatches.join("\n")
    );
}

#[test]
fn header_defines_nothing_rust_does_not_know() {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(HEADER)).unwrap();
    let known: Vec<String> = constants().into_iter().map(|(n, _)| n).collect();
    let structs: Vec<&str> = layout().iter().map(|(s, _, _)| *s).collect();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("#define"), Some(name)) if name.starts_with("CXLA_") => {
                assert!(
                    known.contains(&name.to_string()),
                    "{name} is not in protocol.rs"
                );
            }
            (Some("struct"), Some(name)) if line.trim_end().ends_with('{') => {
                assert!(
                    structs.contains(&name),
                    "struct {name} is not in protocol.rs"
                );
            }
            _ => {}
        }
    }
}

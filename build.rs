//! Assembles the Redis scripts of lua/: each algorithm's arithmetic is written once, in the
//! sections of lua/algorithm/<algorithm>.lua, and inserted at every `-- insert: <algorithm>
//! <section>` line of the scripts that run it: lua/policies.lua, and lua/lone.lua, made
//! once for each algorithm that has a lone policy's script of its own. Done here, at build
//! time, so that the code compiles the finished scripts in with `include_str!` and a
//! misnamed section is a build error, not a script that fails in Redis.

use std::collections::BTreeMap;
use std::env;
use std::fs;
use std::path::{Path, PathBuf};

const ALGORITHMS: [&str; 3] = ["sliding_window", "token_bucket", "sliding_log"];
/// The algorithms whose lone policy has a script of its own, made of lua/lone.lua.
const LONE: [&str; 2] = ["token_bucket", "sliding_window"];
const INSERT: &str = "-- insert: ";
const SECTION: &str = "-- section: ";

fn main() {
    let lua = Path::new("lua");
    println!("cargo::rerun-if-changed=lua");
    let sections: BTreeMap<(String, String), String> = ALGORITHMS
        .iter()
        .flat_map(|algorithm| {
            let path = lua.join("algorithm").join(format!("{algorithm}.lua"));
            sections_of(&read(&path))
                .into_iter()
                .map(move |(name, text)| ((algorithm.to_string(), name), text))
        })
        .collect();
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // (the file made, the template's name in errors, the template)
    let mut scripts = vec![(
        "policies".to_owned(),
        "lua/policies.lua".to_owned(),
        read(&lua.join("policies.lua")),
    )];
    let lone = read(&lua.join("lone.lua"));
    for algorithm in LONE {
        scripts.push((
            format!("lone_{algorithm}"),
            format!("lua/lone.lua for {algorithm}"),
            lone.replace("{algorithm}", algorithm),
        ));
    }
    for (name, template_name, template) in scripts {
        let assembled = assemble(&template, &sections)
            .unwrap_or_else(|problem| panic!("{template_name}: {problem}"));
        let target = out.join(format!("{name}.lua"));
        fs::write(&target, assembled)
            .unwrap_or_else(|error| panic!("writing {}: {error}", target.display()));
    }
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()))
}

/// The sections of an algorithm's file, by name: from each `-- section: <name>` line to
/// the next one, without trailing blank lines. What comes before the first is the file's
/// header, for its reader alone.
fn sections_of(text: &str) -> Vec<(String, String)> {
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix(SECTION) {
            sections.push((name.trim().to_owned(), String::new()));
        } else if let Some((_, body)) = sections.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    for (_, body) in &mut sections {
        body.truncate(body.trim_end().len() + 1);
    }
    sections
}

/// `template` with each insert line followed by its section, indented as the line is.
fn assemble(
    template: &str,
    sections: &BTreeMap<(String, String), String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(template.len() * 2);
    for line in template.lines() {
        out.push_str(line);
        out.push('\n');
        let trimmed = line.trim_start();
        let Some(named) = trimmed.strip_prefix(INSERT) else {
            continue;
        };
        let indent = &line[..line.len() - trimmed.len()];
        let (algorithm, section) = named
            .trim()
            .split_once(' ')
            .ok_or_else(|| format!("`{line}` names no section"))?;
        let body = sections
            .get(&(algorithm.to_owned(), section.to_owned()))
            .ok_or_else(|| format!("lua/algorithm/{algorithm}.lua has no section {section}"))?;
        for body_line in body.lines() {
            if !body_line.is_empty() {
                out.push_str(indent);
            }
            out.push_str(body_line);
            out.push('\n');
        }
    }
    Ok(out)
}

//! Writes the README as the crate docs show it (`$OUT_DIR/README.md`, included by
//! `src/lib.rs`). The one difference: the chart, which the repository shows from
//! `docs/outage.svg`, is inlined as SVG markup, because docs.rs serves the generated docs
//! and no other file of the package, so a relative image link would be broken there.

use std::path::Path;
use std::{env, fs};

const CHART_LINK: &str = "](docs/outage.svg)";

fn main() {
    println!("cargo::rerun-if-changed=README.md");
    println!("cargo::rerun-if-changed=docs/outage.svg");
    let Ok(readme) = fs::read_to_string("README.md") else {
        println!("cargo::error=README.md is missing: the crate docs are made from it");
        return;
    };
    let svg = fs::read_to_string("docs/outage.svg").ok();
    let doc = readme
        .lines()
        .map(
            |line| match (&svg, line.starts_with("![") && line.ends_with(CHART_LINK)) {
                (Some(svg), true) => inline(svg, &line[2..line.len() - CHART_LINK.len()]),
                _ => line.to_owned(),
            },
        )
        .collect::<Vec<_>>()
        .join("\n");
    let Some(out) = env::var_os("OUT_DIR") else {
        println!("cargo::error=OUT_DIR is not set");
        return;
    };
    if let Err(error) = fs::write(Path::new(&out).join("README.md"), doc + "\n") {
        println!("cargo::error=cannot write the crate docs' README: {error}");
    }
}

/// The chart as one HTML block: no blank line inside (a blank line would end the block),
/// scaled to the page's width, with the image's alternative text as its label.
fn inline(svg: &str, alt: &str) -> String {
    let svg = svg
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    let label = alt.replace('&', "&amp;").replace('"', "&quot;");
    // The opening tag loses its fixed size (the viewBox keeps the aspect ratio).
    let Some(end) = svg.find('>') else {
        return svg;
    };
    let (open, rest) = svg.split_at(end);
    let open = open
        .split(' ')
        .filter(|attribute| !attribute.starts_with("width=") && !attribute.starts_with("height="))
        .collect::<Vec<_>>()
        .join(" ");
    format!("{open} role=\"img\" aria-label=\"{label}\" width=\"100%\"{rest}")
}

//! The layering that src/lib.rs states under `# Layers` holds: every module is in the list,
//! and its code (outside its `#[cfg(test)] mod tests`, comments aside) names by `crate::`
//! paths only modules of its own layer or of the layers above it, with no cycle. The list is
//! read from lib.rs itself, so the doc and the check cannot drift apart.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Uses = BTreeMap<String, BTreeSet<String>>;

/// Each module's layer, from lib.rs's `# Layers` list: the modules of a numbered item are the
/// ones it links (`[`name`]`, `[`name::Item`]`).
fn layers(lib: &str) -> Result<BTreeMap<String, u32>, String> {
    let (mut layers, mut layer) = (BTreeMap::new(), 0);
    let section = lib.lines().skip_while(|l| *l != "//! # Layers").skip(1);
    for line in section.take_while(|l| l.starts_with("//!") && !l.starts_with("//! #")) {
        let text = line.trim_start_matches("//!").trim_start();
        let number = text.split_once(". ").and_then(|(n, _)| n.parse().ok());
        layer = number.unwrap_or(layer);
        for link in text.split("[`").skip(1).filter(|_| layer > 0) {
            let name = link
                .split(['`', ':'])
                .next()
                .unwrap_or_default()
                .to_string();
            match layers.insert(name.clone(), layer) {
                Some(other) if other != layer => {
                    return Err(format!("{name} is listed in layers {other} and {layer}"))
                }
                _ => {}
            }
        }
    }
    Ok(layers)
}

/// Every file under `dir`.
fn files(dir: &Path) -> Vec<PathBuf> {
    let entries = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path());
    entries
        .flat_map(|path| {
            if path.is_dir() {
                files(&path)
            } else {
                vec![path]
            }
        })
        .collect()
}

/// The sets of modules that use each other (each is a cycle).
fn cycles(uses: &Uses) -> BTreeSet<Vec<&String>> {
    let reach = |from: &String| {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![from]);
        while let Some(module) = todo.pop() {
            for next in uses.get(module).into_iter().flatten() {
                if seen.insert(next) {
                    todo.push(next);
                }
            }
        }
        seen
    };
    let in_cycle = uses.keys().filter(|m| reach(m).contains(m));
    let members = |m: &String| {
        reach(m)
            .into_iter()
            .filter(|n| reach(n).contains(m))
            .collect()
    };
    in_cycle.map(members).collect()
}

#[test]
fn modules_use_only_their_layer_and_the_layers_above() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = fs::read_to_string(src.join("lib.rs")).unwrap();
    let layers = layers(&lib).unwrap();
    // The modules lib.rs declares; those under `#[cfg(test)]` are test code, which may use any.
    let (mut declared, mut test_only) = (BTreeSet::new(), BTreeSet::new());
    for (before, line) in lib.lines().zip(lib.lines().skip(1)) {
        let line = line.trim_start_matches("pub ");
        if let Some(name) = line.strip_prefix("mod ").and_then(|l| l.strip_suffix(';')) {
            let set = if before == "#[cfg(test)]" {
                &mut test_only
            } else {
                &mut declared
            };
            set.insert(name.to_string());
        }
    }
    let listed: BTreeSet<String> = layers.keys().cloned().collect();
    let mut failures: Vec<String> = declared
        .symmetric_difference(&listed)
        .map(|m| format!("{m} is a module declared in lib.rs or listed in # Layers, not both"))
        .collect();
    let mut uses = Uses::new();
    for file in files(&src) {
        let shown = file.strip_prefix(&src).unwrap().display().to_string();
        let module = shown.split(['/', '.']).next().unwrap().to_string();
        if ["lib", "main"].contains(&module.as_str()) || test_only.contains(&module) {
            continue;
        }
        let text = fs::read_to_string(&file).unwrap();
        let code = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap()
            .lines();
        for line in code.filter(|l| !l.trim_start().starts_with("//")) {
            if line.contains("crate::{") {
                failures.push(format!("{shown}: `crate::{{…}}`: name one module per path"));
            }
            for path in line.split("crate::").skip(1) {
                let used = path
                    .split(|c: char| !c.is_alphanumeric() && c != '_')
                    .next();
                let used = used.unwrap_or_default().to_string();
                // A group's modules are not read (it is refused above).
                if !used.is_empty() && used != module && !test_only.contains(&used) {
                    uses.entry(module.clone()).or_default().insert(used);
                }
            }
        }
    }
    for (module, used) in &uses {
        for other in used {
            match (layers.get(module), layers.get(other)) {
                (Some(mine), Some(theirs)) if theirs > mine => failures.push(format!(
                    "{module} (layer {mine}) uses {other} (layer {theirs}), a layer below it"
                )),
                (Some(_), Some(_)) => {}
                _ => failures.push(format!("{module} uses {other}: not both in # Layers")),
            }
        }
    }
    for cycle in cycles(&uses) {
        failures.push(format!("{cycle:?} use each other (a cycle)"));
    }
    let failures = failures.join("\n");
    assert!(
        failures.is_empty(),
        "src/ breaks the # Layers of src/lib.rs:\n{failures}"
    );
}

/// The command modules (`src/commands/<family>.rs`, with their own submodules) never name one
/// another: what two families share lives in `commands/mod.rs` or below `commands/` (the lock
/// operations in `src/lock/`), so each spelling of an operation calls down into it and a new
/// spelling is a row of the table and a handler. Checked on every `super::<name>` and
/// `crate::commands::<name>` path of a command module's code (comments aside).
#[test]
fn command_modules_use_no_other_command_module() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/commands");
    let family = |path: &Path| {
        let shown = path.strip_prefix(&dir).unwrap().display().to_string();
        shown.split(['/', '.']).next().unwrap().to_string()
    };
    let families: BTreeSet<String> = files(&dir)
        .iter()
        .map(|path| family(path))
        .filter(|name| name != "mod")
        .collect();
    assert!(families.contains("scripts") && families.contains("set"));
    let mut failures = Vec::new();
    for file in files(&dir) {
        let own = family(&file);
        if own == "mod" {
            continue;
        }
        let text = fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        // A submodule's `super` is its own family's module.
        let nested = file.parent() != Some(dir.as_path());
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (prefix, applies) in [("super::", !nested), ("crate::commands::", true)] {
                for path in line.split(prefix).skip(1).filter(|_| applies) {
                    let named: String = path
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if named != own && families.contains(&named) {
                        failures.push(format!("{own} names the command module {named}: {line}"));
                    }
                }
            }
            if line.contains("use super::{") && !nested {
                let group = line.split("use super::{").nth(1).unwrap_or_default();
                for named in group
                    .split([',', '}', ' '])
                    .filter(|n| families.contains(*n))
                {
                    failures.push(format!("{own} names the command module {named}: {line}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

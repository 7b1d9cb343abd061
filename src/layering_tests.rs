//! The library's layers, checked on its sources: each top-level module imports only the layers
//! below its own (the order of `docs/architecture.md`), and no modules import each other in a
//! cycle at any depth (`queue::intake` and `queue::read`, say). The test reads `use` items and
//! `crate::`/`super::` paths of every file under `src/`, leaving out `#[cfg(test)]` modules.
//! The binary's modules (those `main.rs` declares, such as `bench`) sit on top of the library:
//! their `cairn::` paths name the library's modules, so they are checked as its top layer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The top-level modules from the bottom layer up; a module may use only those of lower layers.
const LAYERS: &[&[&str]] = &[
    &["task_id", "submitter", "cost", "shutdown", "safe_fs"],
    &["task"],
    &["limits", "store"],
    &["clients", "observe", "queue"],
    &["runner"],
    &["daemon"],
    &["client"],
    &["cli"],
    // The binary's, above everything of the library.
    &["bench"],
];

/// A module's path below the crate root, `["queue", "read"]` for `src/queue/read/mod.rs`.
type ModPath = Vec<String>;

/// Every source file's module path and text (the binary's `main.rs` only declares modules).
fn sources(dir: &Path, root: &Path, out: &mut Vec<(ModPath, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, root, out);
            continue;
        }
        let relative = path.strip_prefix(root).unwrap().with_extension("");
        let mut module: ModPath = relative
            .iter()
            .map(|s| s.to_string_lossy().into())
            .collect();
        if matches!(
            module.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            if module == ["main"] || path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            module.pop();
        }
        if path.extension().is_some_and(|e| e == "rs") {
            out.push((module, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

/// `a::{b, c::{d, e}}` as `a::b`, `a::c::d`, `a::c::e` (spaces already removed).
fn expand(tree: &str) -> Vec<String> {
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or(tree).to_string()];
    };
    let (prefix, inner) = (
        &tree[..open],
        &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())],
    );
    let (mut items, mut current, mut depth) = (Vec::new(), String::new(), 0);
    for c in inner.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    items.push(current);
    items
        .iter()
        .flat_map(|item| expand(&format!("{prefix}{item}")))
        .collect()
}

/// The rest of `line` after `use ` when it starts a `use` item (`pub(crate) use ...` too).
fn use_tree_start(line: &str) -> Option<&str> {
    let line = match line.strip_prefix("pub") {
        Some(rest) if rest.starts_with('(') => rest.split_once(')')?.1.trim_start(),
        Some(rest) => rest.strip_prefix(' ')?,
        None => line,
    };
    line.strip_prefix("use ")
}

/// The top-level modules of the binary: the `mod NAME;` lines of `main.rs`.
fn binary_modules(root: &Path) -> BTreeSet<String> {
    let main = std::fs::read_to_string(root.join("main.rs")).unwrap();
    main.lines()
        .filter_map(|line| line.trim().strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

/// The paths `source` names that start at `crate`, `super` or `self` (or `cairn`, the library
/// as the binary's modules name it).
fn named_paths(source: &str) -> Vec<String> {
    let code = source.split("#[cfg(test)]\nmod ").next().unwrap_or(source);
    let code: String = code
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut paths = Vec::new();
    let mut statement: Option<String> = None;
    for line in code.lines() {
        let trimmed = line.trim_start();
        if statement.is_none() {
            statement = use_tree_start(trimmed).map(str::to_string);
        } else if let Some(open) = statement.as_mut() {
            open.push_str(trimmed);
        }
        if let Some(tree) = statement.take_if(|tree| tree.contains(';')) {
            let tree: String = tree
                .split(';')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect();
            paths.extend(expand(&tree));
        }
    }
    for word in code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')) {
        if ["crate::", "super::", "cairn::"]
            .iter()
            .any(|root| word.starts_with(root))
        {
            paths.push(word.trim_end_matches(':').to_string());
        }
    }
    paths
}

/// Where `path`, named in module `from`, points, as a module path (items included). The
/// binary's modules and the library's share one root: their names differ, and `cairn::` means
/// the library only in the binary's (`in_binary`).
fn resolve(from: &[String], path: &str, in_binary: bool) -> Option<ModPath> {
    let mut segments = path.split("::").filter(|s| !s.is_empty() && *s != "*");
    let mut target: ModPath = match segments.next()? {
        "crate" => Vec::new(),
        "cairn" if in_binary => Vec::new(),
        "super" => from[..from.len().checked_sub(1)?].to_vec(),
        "self" => from.to_vec(),
        _ => return None,
    };
    for segment in segments {
        match segment {
            "super" => _ = target.pop(),
            "self" => {}
            _ => target.push(segment.to_string()),
        }
    }
    Some(target)
}

/// For each parent module, which of its child modules use which others.
fn edges() -> BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    let binary = binary_modules(&root);
    let modules: BTreeSet<ModPath> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut edges: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (from, source) in &files {
        let in_binary = from.first().is_some_and(|top| binary.contains(top));
        let targets = named_paths(source)
            .iter()
            .filter_map(|p| resolve(from, p, in_binary))
            .collect::<Vec<_>>();
        for target in targets {
            let common = from.iter().zip(&target).take_while(|(a, b)| a == b).count();
            let (Some(a), Some(b)) = (from.get(common), target.get(common)) else {
                continue;
            };
            if modules.contains(&target[..=common]) {
                let parent = from[..common].to_vec();
                edges
                    .entry(parent)
                    .or_default()
                    .entry(a.clone())
                    .or_default()
                    .insert(b.clone());
            }
        }
    }
    edges
}

/// A cycle through `start` in `graph`, if any (depth first).
fn cycle_from(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![(start.to_string(), vec![start.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((node, path)) = stack.pop() {
        for next in graph.get(&node).into_iter().flatten() {
            if next == start {
                return Some(path.clone());
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

#[test]
fn each_layer_uses_only_the_layers_below_it() {
    let rank = |name: &str| LAYERS.iter().position(|layer| layer.contains(&name));
    let top = edges().remove(&Vec::new()).unwrap_or_default();
    let mut wrong = Vec::new();
    for (from, targets) in &top {
        let Some(own) = rank(from) else {
            wrong.push(format!("{from} is in no layer of LAYERS"));
            continue;
        };
        for target in targets {
            if rank(target).is_none_or(|theirs| theirs >= own) {
                wrong.push(format!("{from} uses {target}"));
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the layering: {wrong:#?}");
}

#[test]
fn no_modules_import_each_other_in_a_cycle() {
    let mut cycles = Vec::new();
    for (parent, graph) in edges() {
        for start in graph.keys() {
            if let Some(cycle) = cycle_from(&graph, start) {
                cycles.push(format!(
                    "in crate::{}: {}",
                    parent.join("::"),
                    cycle.join(" -> ")
                ));
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles: {cycles:#?}");
}

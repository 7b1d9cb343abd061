//! Only the queue's owner (`src/queue/`, `src/store/`) names the queue's directories and files.
//! This test reads the sources of the modules listed in [`CHECKED_DIRS`] and fails, naming file
//! and line, on a string literal that names one as a path: `root.join("done")`,
//! `"runs/{id}/x"`, `"{}/control"`, `"current_work.json"`. Comments, help text in attributes,
//! JSON keys (`"inbox": n`) and words such as a state `"done"` are not paths.

use std::path::{Path, PathBuf};

/// The source directories that must not name the queue's files. Widen it as modules move
/// behind the owner.
const CHECKED_DIRS: &[&str] = &["src/cli", "src/bench", "src/daemon", "src/runner"];

/// The queue's directories and files, as `queue/README.md` lists them.
const QUEUE_NAMES: &[&str] = &[
    "done",
    "failed",
    "incremental",
    "current_work.json",
    "current_work.log",
    "limits.json",
    "tasks",
    "inbox",
    "control",
    "runs",
    "blobs",
];

/// Calls whose string argument is a path.
const PATH_CALLS: &[&str] = &[
    ".join(",
    "Path::new(",
    "PathBuf::from(",
    "create_dir(",
    "create_dir_all(",
    "read_dir(",
    ".list(",
];

/// A string literal of the code (not of a comment or an attribute).
#[derive(Debug)]
struct Literal {
    /// 1-based line where the literal starts.
    line: usize,
    text: String,
    /// The code just before it on its line, and the first character after it.
    before: String,
    after: Option<char>,
}

/// The string literals of `source` outside comments and attributes.
fn code_literals(source: &str) -> Vec<Literal> {
    let chars: Vec<char> = source.chars().collect();
    let mut literals = Vec::new();
    let (mut i, mut line) = (0, 1);
    let mut line_code = String::new();
    // Open brackets of the attribute being read (`#[...]`), 0 outside attributes.
    let mut attribute_depth = 0usize;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            '\n' => {
                line += 1;
                line_code.clear();
                i += 1;
            }
            '/' if next == Some('/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if next == Some('*') => {
                i = skip_block_comment(&chars, i, &mut line);
            }
            '#' if matches!(next, Some('[') | Some('!')) && attribute_depth == 0 => {
                attribute_depth = 0;
                i += 1;
                if chars.get(i) == Some(&'!') {
                    i += 1;
                }
                if chars.get(i) == Some(&'[') {
                    attribute_depth = 1;
                    i += 1;
                }
            }
            '[' if attribute_depth > 0 => {
                attribute_depth += 1;
                i += 1;
            }
            ']' if attribute_depth > 0 => {
                attribute_depth -= 1;
                i += 1;
            }
            '\'' => i = skip_char_literal(&chars, i),
            '"' | 'r' | 'b' if starts_string(&chars, i) => {
                let start_line = line;
                let (text, end) = read_string(&chars, i, &mut line);
                if attribute_depth == 0 {
                    let after = chars[end..].iter().copied().find(|c| !c.is_whitespace());
                    literals.push(Literal {
                        line: start_line,
                        text,
                        before: line_code.clone(),
                        after,
                    });
                }
                line_code.clear();
                i = end;
            }
            _ => {
                if !c.is_whitespace() {
                    line_code.push(c);
                }
                i += 1;
            }
        }
    }
    literals
}

/// Whether a string literal (`"`, `r"`, `r#"`, `b"`, `br"`) starts at `i`, and not in the middle
/// of an identifier such as `for`.
fn starts_string(chars: &[char], i: usize) -> bool {
    if chars[i] == '"' {
        return true;
    }
    if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return false;
    }
    let mut j = i;
    if chars[j] == 'b' {
        j += 1;
    }
    if chars.get(j) == Some(&'r') {
        j += 1;
        while chars.get(j) == Some(&'#') {
            j += 1;
        }
    }
    j > i && chars.get(j) == Some(&'"')
}

/// The text of the string literal at `i` and the index after it.
fn read_string(chars: &[char], mut i: usize, line: &mut usize) -> (String, usize) {
    if chars[i] == 'b' {
        i += 1;
    }
    let mut hashes = 0;
    let raw = chars[i] == 'r';
    if raw {
        i += 1;
        while chars[i] == '#' {
            hashes += 1;
            i += 1;
        }
    }
    i += 1; // the opening quote
    let mut text = String::new();
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            *line += 1;
        }
        if !raw && c == '\\' {
            text.push(c);
            if let Some(escaped) = chars.get(i + 1) {
                if *escaped == '\n' {
                    *line += 1;
                }
                text.push(*escaped);
            }
            i += 2;
            continue;
        }
        if c == '"' && (0..hashes).all(|k| chars.get(i + 1 + k) == Some(&'#')) {
            return (text, i + 1 + hashes);
        }
        text.push(c);
        i += 1;
    }
    (text, i)
}

/// Past a char literal (`'x'`, `'\n'`, `'\''`) at `i`, or past the quote of a lifetime.
fn skip_char_literal(chars: &[char], i: usize) -> usize {
    match (chars.get(i + 1), chars.get(i + 2)) {
        (Some('\\'), _) => {
            let mut j = i + 3;
            while j < chars.len() && chars[j] != '\'' {
                j += 1;
            }
            j + 1
        }
        (Some(_), Some('\'')) => i + 3,
        _ => i + 1,
    }
}

/// Past a (nested) block comment starting at `i`.
fn skip_block_comment(chars: &[char], mut i: usize, line: &mut usize) -> usize {
    let mut depth = 0;
    while i < chars.len() {
        match (chars[i], chars.get(i + 1)) {
            ('/', Some('*')) => {
                depth += 1;
                i += 2;
            }
            ('*', Some('/')) => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            (c, _) => {
                if c == '\n' {
                    *line += 1;
                }
                i += 1;
            }
        }
    }
    i
}

/// The queue name a literal uses as a path, if any.
fn names_queue_path(literal: &Literal) -> Option<&'static str> {
    let text = literal.text.as_str();
    let path_call = PATH_CALLS.iter().any(|call| literal.before.ends_with(call));
    let json_key = literal.after == Some(':');
    for name in QUEUE_NAMES {
        if name.contains('.') && text.contains(name) {
            return Some(name);
        }
        if text == *name && path_call && !json_key {
            return Some(name);
        }
        if is_path_component(text, name) {
            return Some(name);
        }
    }
    None
}

/// `name/` or `/name` as a whole component: `runs/{id}`, `{}/control`, not `{done}/{total}`.
fn is_path_component(text: &str, name: &str) -> bool {
    let is_word = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.');
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + name.len()..].chars().next();
        let starts_word = before.is_none_or(|c| !is_word(c) && c != '{');
        let ends_word = after.is_none_or(|c| !is_word(c) && c != '}');
        (starts_word && after == Some('/')) || (before == Some('/') && ends_word)
    })
}

/// `file:line: "literal"` for every queue path named in the file.
fn findings(path: &Path, source: &str) -> Vec<String> {
    code_literals(source)
        .iter()
        .filter_map(|literal| {
            let name = names_queue_path(literal)?;
            Some(format!(
                "{}:{}: {:?} names the queue's {name:?}",
                path.display(),
                literal.line,
                literal.text
            ))
        })
        .collect()
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

#[test]
fn only_the_owner_names_the_queue_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for dir in CHECKED_DIRS {
        for file in rust_files(&root.join(dir)) {
            let source = std::fs::read_to_string(&file).expect("a readable source file");
            let shown = file.strip_prefix(root).unwrap_or(&file);
            found.extend(findings(shown, &source));
        }
    }
    assert!(
        found.is_empty(),
        "outside src/queue and src/store, ask the queue's owner (QueueDir, QueueReader, \
         CheckpointStore) for paths instead of naming them:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scanner_tells_paths_from_words() {
    let source = r##"
        //! Reads done/<id>.json: a comment.
        #[command(after_help = "files in incremental/<id>.json.gz
            and runs/")]
        fn f(root: &Path) {
            let a = root.join("done");
            let b = format!("runs/{id}/start.json");
            let c = format!("{}/control", root.display());
            let d = "current_work.json";
            let e = json!({"inbox": 1, "tasks": []});
            let g = if state == "done" { "failed".into() } else { format!("{done}/{total}") };
            let h = r#"still in inbox/"#;
            let i = 'x';
            let j = storage.create_dir("incremental");
            /* root.join("tasks") */
        }
    "##;
    let flagged: Vec<(usize, String)> = code_literals(source)
        .iter()
        .filter(|l| names_queue_path(l).is_some())
        .map(|l| (l.line, l.text.clone()))
        .collect();
    let expected = [
        (6, "done"),
        (7, "runs/{id}/start.json"),
        (8, "{}/control"),
        (9, "current_work.json"),
        (12, "still in inbox/"),
        (14, "incremental"),
    ];
    let expected: Vec<(usize, String)> = expected
        .iter()
        .map(|(line, text)| (*line, text.to_string()))
        .collect();
    assert_eq!(flagged, expected);
}

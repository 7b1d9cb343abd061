//! JSON as Python's `json` module writes it: standard JSON plus the bare tokens `NaN`,
//! `Infinity` and `-Infinity` for floats that JSON cannot hold (Python reads them back). A
//! checkpoint file of the Python pattern holds them whenever its state has such a float.
//!
//! Such a document is read by standing each token in for a number that occurs nowhere in the
//! text; numbers are kept as written (serde_json's `arbitrary_precision`), so the stand-ins stay
//! recognisable, and printing turns them back into the tokens as written.

use std::io;

use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter};
use serde_json::Value;

/// The tokens Python writes for `float('nan')` and `float('inf')` (`-Infinity` is `-` before
/// the second).
const TOKENS: [&str; 2] = ["NaN", "Infinity"];

/// A parsed document, and the stand-ins for the non-standard tokens it held, if any.
#[derive(Debug)]
pub(super) struct PythonJson {
    pub value: Value,
    stand_ins: Option<StandIns>,
}

/// The numbers standing in for [`TOKENS`] (same order).
#[derive(Debug)]
struct StandIns {
    numbers: [String; 2],
    /// Which tokens occurred (`-Infinity` counted as such).
    found: Vec<&'static str>,
}

impl PythonJson {
    /// Standard JSON, or JSON with Python's non-standard tokens outside strings.
    pub(super) fn parse(bytes: &[u8]) -> Result<PythonJson, serde_json::Error> {
        let error = match serde_json::from_slice(bytes) {
            Ok(value) => {
                return Ok(PythonJson {
                    value,
                    stand_ins: None,
                })
            }
            Err(error) => error,
        };
        let Ok(text) = std::str::from_utf8(bytes) else {
            return Err(error);
        };
        let mut stand_ins = StandIns::absent_from(text);
        let replaced = stand_ins.replace_tokens(text);
        if stand_ins.found.is_empty() {
            return Err(error);
        }
        Ok(PythonJson {
            value: serde_json::from_str(&replaced)?,
            stand_ins: Some(stand_ins),
        })
    }

    /// The non-standard tokens the document held (`NaN`, `Infinity`, `-Infinity`), if any.
    pub(super) fn non_standard_tokens(&self) -> &[&'static str] {
        self.stand_ins.as_ref().map_or(&[], |s| &s.found)
    }

    /// `value` (or any part of it) pretty-printed, non-standard tokens as written.
    pub(super) fn to_string_pretty(&self, value: &Value) -> String {
        let mut out = Vec::new();
        let formatter = TokenFormatter {
            pretty: PrettyFormatter::new(),
            stand_ins: self.stand_ins.as_ref(),
        };
        let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
        // Writing a Value into memory cannot fail.
        let _ = value.serialize(&mut serializer);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl StandIns {
    /// Stand-in numbers that occur nowhere in `text`, so none can be confused with its numbers.
    fn absent_from(text: &str) -> StandIns {
        let base = (0u64..)
            .map(|n| format!("0.7071067811865475244008443621{n}"))
            .find(|base| !text.contains(base.as_str()))
            .unwrap_or_default();
        StandIns {
            numbers: [format!("{base}1"), format!("{base}2")],
            found: Vec::new(),
        }
    }

    /// `text` with each token outside strings replaced by its stand-in.
    fn replace_tokens(&mut self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find(['"', 'N', 'I']) {
            out.push_str(&rest[..at]);
            rest = &rest[at..];
            if rest.starts_with('"') {
                let end = string_end(rest);
                out.push_str(&rest[..end]);
                rest = &rest[end..];
                continue;
            }
            match TOKENS.iter().position(|token| rest.starts_with(token)) {
                Some(i) => {
                    let negative = out.ends_with('-');
                    self.note(if negative && i == 1 {
                        "-Infinity"
                    } else {
                        TOKENS[i]
                    });
                    out.push_str(&self.numbers[i]);
                    rest = &rest[TOKENS[i].len()..];
                }
                None => {
                    out.push_str(&rest[..1]);
                    rest = &rest[1..];
                }
            }
        }
        out.push_str(rest);
        out
    }

    fn note(&mut self, token: &'static str) {
        if !self.found.contains(&token) {
            self.found.push(token);
        }
    }

    /// The token a printed number stands for, sign included.
    fn token_for(&self, number: &str) -> Option<String> {
        let (sign, digits) = match number.strip_prefix('-') {
            Some(digits) => ("-", digits),
            None => ("", number),
        };
        let i = self.numbers.iter().position(|n| n == digits)?;
        Some(format!("{sign}{}", TOKENS[i]))
    }
}

/// The length of the JSON string at the start of `text` (quotes included; to the end of the
/// text when it is not closed).
fn string_end(text: &str) -> usize {
    let mut escaped = false;
    for (i, c) in text.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return i + 1,
            _ => {}
        }
    }
    text.len()
}

/// serde_json's pretty printer, writing stand-ins back as the tokens they stand for.
struct TokenFormatter<'s> {
    pretty: PrettyFormatter<'static>,
    stand_ins: Option<&'s StandIns>,
}

impl Formatter for TokenFormatter<'_> {
    fn write_number_str<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        value: &str,
    ) -> io::Result<()> {
        match self.stand_ins.and_then(|s| s.token_for(value)) {
            Some(token) => w.write_all(token.as_bytes()),
            None => w.write_all(value.as_bytes()),
        }
    }
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.pretty.begin_array(w)
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.pretty.end_array(w)
    }
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.pretty.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.pretty.end_array_value(w)
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.pretty.begin_object(w)
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.pretty.end_object(w)
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.pretty.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.pretty.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.pretty.end_object_value(w)
    }
}

#[cfg(test)]
mod tests {
    use super::PythonJson;

    fn pretty(text: &str) -> (String, Vec<&'static str>) {
        let parsed = PythonJson::parse(text.as_bytes()).unwrap();
        (
            parsed.to_string_pretty(&parsed.value),
            parsed.non_standard_tokens().to_vec(),
        )
    }

    #[test]
    fn python_tokens_are_read_and_printed_as_written() {
        let (text, found) = pretty(r#"{"a": NaN, "b": [Infinity, -Infinity, 1.5], "c": -0.0}"#);
        assert_eq!(
            text,
            "{\n  \"a\": NaN,\n  \"b\": [\n    Infinity,\n    -Infinity,\n    1.5\n  ],\n  \"c\": -0.0\n}"
        );
        assert_eq!(found, ["NaN", "Infinity", "-Infinity"]);
    }

    #[test]
    fn tokens_inside_strings_stay_untouched() {
        let source = r#"{"s": "NaN and Infinity, \"NaN\" -Infinity \\", "n": NaN}"#;
        let parsed = PythonJson::parse(source.as_bytes()).unwrap();
        assert_eq!(parsed.value["s"], r#"NaN and Infinity, "NaN" -Infinity \"#);
        assert_eq!(parsed.non_standard_tokens(), ["NaN"]);
        let (text, _) = pretty(r#"["NaN", "Infinity"]"#);
        assert!(text.contains("\"NaN\""), "{text}");
    }

    #[test]
    fn standard_json_has_no_tokens_and_a_stand_in_never_meets_a_real_number() {
        let (_, found) = pretty(r#"{"a": 1}"#);
        assert!(found.is_empty());
        // The text already holds the first stand-ins' digits: others are chosen.
        let source = r#"{"x": 0.707106781186547524400844362101, "y": NaN}"#;
        let (text, _) = pretty(source);
        assert!(
            text.contains("\"x\": 0.707106781186547524400844362101,"),
            "{text}"
        );
        assert!(text.contains("\"y\": NaN"), "{text}");
    }

    #[test]
    fn invalid_json_stays_an_error() {
        assert!(PythonJson::parse(b"{\"a\": nan}").is_err());
        assert!(PythonJson::parse(b"{\"a\": NaN").is_err());
        assert!(PythonJson::parse(b"[1,]").is_err());
    }
}

//! A `POST /v1/predict` body → the rows to score, or the reason it is refused.
//!
//! ```json
//! {"rows": [{"features": {"3": 0.5, "17": 1}}, "1:0.5 17:1"], "top_k": 5, "probabilities": true}
//! ```
//!
//! A row is an object `{"features": {"ID": VALUE, …}}` (ids as the dataset's files write
//! them, so with its index base) or one text line in the dataset's syntax (LIBSVM, or
//! XML-repository `labels features`), labels optional. Both are read by the parser `predict
//! --input` reads files with, under the same rules ([`crate::text::new_rows::row_rules`]):
//! an object becomes the line `ID:VALUE …`, so its values go through the same transform and
//! checks as a file's. Every refusal names the field or row and what was expected.
//!
//! An object with a key given twice is refused (400), anywhere in the body: a JSON parser
//! would keep one of the two silently, and a file row with a feature id twice is refused
//! the same way.

use std::collections::HashSet;
use std::fmt;

use serde::de::{Deserialize, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use crate::store::chunks::CsrChunk;
use crate::text::parse::{parse_block, LineSyntax, RowRules};

/// What a request is refused with: an HTTP status (4xx) and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub message: String,
}

impl Refusal {
    /// 400: the body is not JSON.
    pub fn malformed(message: impl Into<String>) -> Self {
        Refusal {
            status: 400,
            message: message.into(),
        }
    }

    /// 422: JSON of the wrong shape, types or values.
    pub fn invalid(message: impl Into<String>) -> Self {
        Refusal {
            status: 422,
            message: message.into(),
        }
    }

    /// 413: more than a limit allows.
    pub fn too_large(message: impl Into<String>) -> Self {
        Refusal {
            status: 413,
            message: message.into(),
        }
    }
}

/// A request, read and checked.
#[derive(Debug)]
pub struct Parsed {
    /// The rows, ids 0, 1, … in request order (a row's id seeds its Monte Carlo noise, as
    /// a file row's position does).
    pub rows: CsrChunk,
    pub top_k: Option<usize>,
    pub probabilities: bool,
}

/// How requests are read: the model's dataset's rules and the server's limits.
pub struct RequestRules {
    pub rows: RowRules,
    pub syntax: LineSyntax,
    /// Rows per request.
    pub max_rows: usize,
    /// Labels a request may ask for (L, or K classes).
    pub n_labels: usize,
}

const FIELDS: [&str; 3] = ["rows", "top_k", "probabilities"];

impl RequestRules {
    /// Reads `body`: JSON (else 400), of the request's shape (else 422), at most
    /// `max_rows` rows (else 413).
    pub fn parse(&self, body: &[u8]) -> Result<Parsed, Refusal> {
        let value = unique_keys_json(body)?;
        let Value::Object(object) = value else {
            return Err(Refusal::invalid(format!(
                "expected a JSON object {{\"rows\": [...]}}, found {}",
                kind(&value)
            )));
        };
        if let Some(other) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(Refusal::invalid(format!(
                "unknown field '{other}', expected one of rows, top_k, probabilities"
            )));
        }
        let top_k = self.top_k(object.get("top_k"))?;
        let probabilities = match object.get("probabilities") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(Refusal::invalid(format!(
                    "probabilities: expected true or false, found {}",
                    kind(v)
                )))
            }
        };
        let rows = match object.get("rows") {
            Some(Value::Array(rows)) => rows,
            Some(v) => {
                return Err(Refusal::invalid(format!(
                    "rows: expected an array of rows, found {}",
                    kind(v)
                )))
            }
            None => return Err(Refusal::invalid("missing field 'rows'")),
        };
        if rows.is_empty() {
            return Err(Refusal::invalid(
                "rows: expected at least one row, found none",
            ));
        }
        if rows.len() > self.max_rows {
            return Err(Refusal::too_large(format!(
                "rows: found {} rows, the limit is {} per request (--max-rows)",
                rows.len(),
                self.max_rows
            )));
        }
        let rows = self.read_rows(rows)?;
        Ok(Parsed {
            rows,
            top_k,
            probabilities,
        })
    }

    fn top_k(&self, value: Option<&Value>) -> Result<Option<usize>, Refusal> {
        let k = match value {
            None | Some(Value::Null) => return Ok(None),
            Some(v) => v.as_u64().filter(|&k| k >= 1),
        };
        match k {
            Some(k) if k as usize <= self.n_labels => Ok(Some(k as usize)),
            _ => Err(Refusal::invalid(format!(
                "top_k: expected an integer from 1 to {} (the model's labels), found {}",
                self.n_labels,
                value.map_or("nothing".into(), |v| v.to_string())
            ))),
        }
    }

    /// The rows as one text block (one line each), parsed by the file parser; a parser
    /// error on line i is reported as row i − 1's.
    fn read_rows(&self, rows: &[Value]) -> Result<CsrChunk, Refusal> {
        let mut text = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            let len = text.len();
            match row {
                Value::String(line) => {
                    if line.contains('\n') {
                        return Err(Refusal::invalid(format!(
                            "rows[{i}]: found a line break, expected one line per row"
                        )));
                    }
                    text.extend_from_slice(line.as_bytes());
                }
                Value::Object(object) => features_line(i, object, &mut text)?,
                other => {
                    return Err(Refusal::invalid(format!(
                        "rows[{i}]: expected an object {{\"features\": {{\"id\": value, …}}}} \
                         or a text line, found {}",
                        kind(other)
                    )))
                }
            }
            if !text[len..]
                .split(|&b| b == b' ')
                .any(|t| t.contains(&b':') && !t.starts_with(b"#"))
            {
                return Err(Refusal::invalid(format!(
                    "rows[{i}]: found no features, expected at least one 'id:value'"
                )));
            }
            text.push(b'\n');
        }
        let parsed = parse_block(&text, 1, true, self.syntax, &self.rows).map_err(|(_, e)| {
            let i = e.line.saturating_sub(1);
            Refusal::invalid(format!("rows[{i}]: {}", e.msg))
        })?;
        let mut chunk = parsed.rows;
        for id in &mut chunk.row_ids {
            *id -= 1; // the parser numbers rows by line, from 1
        }
        Ok(chunk)
    }
}

/// `body` as JSON whose objects each name a key once (else 400, naming the key).
fn unique_keys_json(body: &[u8]) -> Result<Value, Refusal> {
    match serde_json::from_slice::<UniqueKeys>(body) {
        Ok(UniqueKeys(value)) => Ok(value),
        // The only data error a JSON value can raise here is a repeated key.
        Err(e) if e.is_data() => Err(Refusal::malformed(e.to_string())),
        Err(e) => Err(Refusal::malformed(format!("malformed JSON: {e}"))),
    }
}

/// A JSON value whose objects each name a key once.
struct UniqueKeys(Value);

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(UniqueKeysVisitor)
            .map(UniqueKeys)
    }
}

/// Builds the [`Value`] serde_json would, refusing a repeated key.
struct UniqueKeysVisitor;

impl<'de> Visitor<'de> for UniqueKeysVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_f64<E>(self, x: f64) -> Result<Value, E> {
        Ok(Number::from_f64(x).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(UniqueKeys(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(A::Error::custom(format!(
                    "found key '{key}' twice in one object, expected unique keys"
                )));
            }
            let UniqueKeys(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// `{"features": {"ID": VALUE, …}}` as the text line `ID:VALUE …`.
fn features_line(i: usize, row: &Map<String, Value>, text: &mut Vec<u8>) -> Result<(), Refusal> {
    if let Some(other) = row.keys().find(|k| k.as_str() != "features") {
        return Err(Refusal::invalid(format!(
            "rows[{i}]: unknown field '{other}', expected only \"features\""
        )));
    }
    let features = match row.get("features") {
        Some(Value::Object(f)) => f,
        Some(v) => {
            return Err(Refusal::invalid(format!(
                "rows[{i}].features: expected an object {{\"id\": value, …}}, found {}",
                kind(v)
            )))
        }
        None => {
            return Err(Refusal::invalid(format!(
                "rows[{i}]: missing field 'features'"
            )))
        }
    };
    let mut seen = HashSet::with_capacity(features.len());
    for (id, value) in features {
        let number = id
            .parse::<u64>()
            .ok()
            .filter(|_| id.bytes().all(|b| b.is_ascii_digit()));
        let Some(number) = number else {
            return Err(Refusal::invalid(format!(
                "rows[{i}].features: found key '{id}', expected a feature id (a non-negative \
                 integer)"
            )));
        };
        if !seen.insert(number) {
            return Err(Refusal::invalid(format!(
                "rows[{i}].features: feature id {number} is given twice"
            )));
        }
        let Some(v) = value.as_f64() else {
            return Err(Refusal::invalid(format!(
                "rows[{i}].features.{id}: expected a number, found {}",
                kind(value)
            )));
        };
        if !text.is_empty() && text.last() != Some(&b'\n') {
            text.push(b' ');
        }
        // Rust prints the shortest text that reads back as the same f64, so the value
        // reaches the parser as the request wrote it.
        text.extend_from_slice(format!("{number}:{v}").as_bytes());
    }
    Ok(())
}

/// What a JSON value is, for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse::RowRules;

    fn rules() -> RequestRules {
        RequestRules {
            rows: RowRules::new(5, 3, 1),
            syntax: LineSyntax::Libsvm,
            max_rows: 3,
            n_labels: 3,
        }
    }

    fn refused(body: &str) -> Refusal {
        rules().parse(body.as_bytes()).unwrap_err()
    }

    /// Without repeated keys, a body reads as serde_json reads it.
    #[test]
    fn unique_keys_read_as_serde_json_reads() {
        let body = r#"{"a": [1, -2, 0.5, 1e300, "x", null, true, {"b": {}}], "c": {"d": 18446744073709551615}}"#;
        let want: Value = serde_json::from_str(body).unwrap();
        assert_eq!(unique_keys_json(body.as_bytes()).unwrap(), want);
        // Nesting stays bounded by serde_json's depth limit: refused, not a stack overflow.
        let deep = "[".repeat(100_000);
        let refusal = unique_keys_json(deep.as_bytes()).unwrap_err();
        assert!(refusal.message.contains("recursion limit"), "{refusal:?}");
    }

    /// An object row and the text line it stands for parse to the same row; ids count
    /// from 0 in request order.
    #[test]
    fn objects_and_lines_are_the_same_rows() {
        let body = r#"{"rows": [{"features": {"2": 0.5, "5": 3}}, "2:0.5 5:3"], "top_k": 2}"#;
        let parsed = rules().parse(body.as_bytes()).unwrap();
        assert_eq!(parsed.rows.row_ids, vec![0, 1]);
        assert_eq!(parsed.rows.row(0).indices, parsed.rows.row(1).indices);
        assert_eq!(parsed.rows.row(0).values, parsed.rows.row(1).values);
        assert_eq!(parsed.rows.row(0).indices, &[1, 4]);
        assert_eq!((parsed.top_k, parsed.probabilities), (Some(2), false));
    }

    #[test]
    fn every_kind_of_bad_request_is_named() {
        let cases: &[(&str, u16, &str)] = &[
            ("{\"rows\": [", 400, "malformed JSON"),
            ("[1]", 422, "expected a JSON object"),
            ("{\"rows\": 3}", 422, "rows: expected an array"),
            ("{}", 422, "missing field 'rows'"),
            ("{\"rows\": []}", 422, "expected at least one row"),
            ("{\"rows\": [\"1:1\"], \"k\": 1}", 422, "unknown field 'k'"),
            (
                "{\"rows\": [\"1:1\"], \"top_k\": 0}",
                422,
                "top_k: expected an integer from 1 to 3",
            ),
            (
                "{\"rows\": [\"1:1\"], \"top_k\": 4}",
                422,
                "top_k: expected an integer from 1 to 3",
            ),
            (
                "{\"rows\": [\"1:1\"], \"probabilities\": 1}",
                422,
                "probabilities: expected",
            ),
            (
                "{\"rows\": [\"1:1\",\"1:1\",\"1:1\",\"1:1\"]}",
                413,
                "found 4 rows, the limit is 3",
            ),
            ("{\"rows\": [7]}", 422, "rows[0]: expected an object"),
            (
                "{\"rows\": [{\"features\": {}}]}",
                422,
                "rows[0]: found no features",
            ),
            ("{\"rows\": [\"1\"]}", 422, "rows[0]: found no features"),
            (
                "{\"rows\": [\"1:1\", {\"feature\": {}}]}",
                422,
                "rows[1]: unknown field 'feature'",
            ),
            (
                "{\"rows\": [{\"features\": [1]}]}",
                422,
                "rows[0].features: expected an object",
            ),
            (
                "{\"rows\": [{\"features\": {\"x\": 1}}]}",
                422,
                "found key 'x'",
            ),
            (
                "{\"rows\": [{\"features\": {\"-1\": 1}}]}",
                422,
                "found key '-1'",
            ),
            (
                "{\"rows\": [{\"features\": {\"1\": \"a\"}}]}",
                422,
                "features.1: expected a number",
            ),
            (
                "{\"rows\": [{\"features\": {\"9\": 1}}]}",
                422,
                "rows[0]: found feature id 9",
            ),
            (
                "{\"rows\": [\"1:1\", \"2:x\"]}",
                422,
                "rows[1]: found value 'x'",
            ),
            (
                "{\"rows\": [\"1:1\\n2:2\"]}",
                422,
                "rows[0]: found a line break",
            ),
            (
                "{\"rows\": [\"1:1\"], \"top_k\": 1, \"top_k\": 2}",
                400,
                "found key 'top_k' twice in one object, expected unique keys at line 1",
            ),
            (
                "{\"rows\": [{\"features\": {\"2\": 1, \"2\": 1}}]}",
                400,
                "found key '2' twice",
            ),
            (
                "{\"rows\": [[{\"a\": {\"b\": 1, \"b\": 1}}]]}",
                400,
                "found key 'b' twice",
            ),
            (
                "{\"rows\": [{\"features\": {\"2\": 1, \"02\": 1}}]}",
                422,
                "feature id 2 is given twice",
            ),
        ];
        for &(body, status, says) in cases {
            let r = refused(body);
            assert_eq!(r.status, status, "{body}: {}", r.message);
            assert!(
                r.message.contains(says),
                "{body}: {} (want {says})",
                r.message
            );
        }
    }
}

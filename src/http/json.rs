//! JSON request bodies read the way a person means them, for every face.
//!
//! serde's derive takes a JSON array for a struct (its fields by position), so
//! `["python",null,"print(1)"]` would be a valid `/execute`; a repeated key silently
//! wins over the first when parsed into a map; and its messages speak Rust
//! (`expected f64`, `expected struct Body with 8 elements`). Here a body is parsed
//! once into a [`Value`] (a repeated key refused), must be an object, and is then read
//! into its type through [`De`], which takes only objects for structs at every depth.
//! Errors come back as one sentence that names the field by its path
//! (`limits.wallTimeMs must be a number of milliseconds, not a string`).

use serde::de::{self, DeserializeSeed, Expected, IntoDeserializer, Unexpected, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// Words for a field, by its path (`limits.wallTimeMs`, `files[].name`: an index is
/// written `[]`), used in place of the type's own ("a number of milliseconds").
pub type Hints = &'static [(&'static str, &'static str)];

/// Reads a request body into `T`: a JSON object, no key twice, structs only from
/// objects. A body of only whitespace is read as `{}` when `empty_is_object`.
///
/// # Errors
/// One sentence in a person's words, naming the field by its path.
pub fn decode<T: de::DeserializeOwned>(
    body: &[u8],
    hints: Hints,
    empty_is_object: bool,
) -> Result<T, String> {
    let v = parse_object(body, empty_is_object)?;
    let v = Value::Object(v);
    serde_path_to_error::deserialize(De(&v)).map_err(|e| {
        let path = e.path().to_string();
        e.inner()
            .sentence(if path == "." { "" } else { &path }, hints)
    })
}

/// Parses a request body that must be a JSON object (no key twice).
///
/// # Errors
/// One sentence saying what is wrong with it.
pub fn parse_object(body: &[u8], empty_is_object: bool) -> Result<Map<String, Value>, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        if empty_is_object {
            return Ok(Map::new());
        }
        return Err("the body is empty; send a JSON object".into());
    }
    let v = serde_json::from_slice::<Strict>(body)
        .map_err(|e| syntax(&e))?
        .0;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(format!(
            "the body must be a JSON object ({{...}}), not {}",
            kind(&other)
        )),
    }
}

/// A serde_json error (the body is not JSON, or a key repeats) in words.
fn syntax(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let raw = full
        .rsplit_once(" at line ")
        .map_or(full.as_str(), |(m, _)| m);
    let what = match raw {
        "EOF while parsing a value" | "EOF while parsing a list" | "EOF while parsing an object" => {
            "it ends before the JSON is complete (an unclosed {, [ or value?)".to_string()
        }
        "EOF while parsing a string" => "it ends inside a string (a missing closing \"?)".into(),
        "trailing comma" => "a comma before a closing } or ] (JSON allows no trailing comma)".into(),
        "trailing characters" => "there is more after the JSON object ends".into(),
        "expected `:`" => "a key must be followed by a colon".into(),
        "expected `,` or `]`" => "a list item must be followed by a comma or ]".into(),
        "expected `,` or `}`" => "a field must be followed by a comma or }".into(),
        "key must be a string" => "a key must be a string in double quotes".into(),
        "expected value" | "expected ident" => {
            "a value is missing or is not JSON (strings take double quotes; true, false and null are lower case)".into()
        }
        "invalid escape" => "a string has an invalid escape (\\ must be followed by \", \\, /, b, f, n, r, t or uXXXX)".into(),
        "invalid number" => "a number is not written as JSON writes numbers".into(),
        "number out of range" => "a number is too large".into(),
        "recursion limit exceeded" => "it nests more than 128 levels deep".into(),
        m if m.starts_with("control character") => {
            "a string holds a raw control character (write it as \\n, \\t or \\u00XX)".into()
        }
        m => m.to_string(),
    };
    if e.is_data() {
        // Only the repeated key of [`Strict`] gets here: its message is already words.
        return format!(
            "the body is not usable: {what} (line {}, column {})",
            e.line(),
            e.column()
        );
    }
    format!(
        "the body is not valid JSON: {what} (line {}, column {})",
        e.line(),
        e.column()
    )
}

/// What a value is, in words.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "true or false",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A JSON value parsed with every object's keys checked for repeats.
struct Strict(Value);

impl<'de> de::Deserialize<'de> for Strict {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Strict, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Strict;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Strict, E> {
        Ok(Strict(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Strict, E> {
        // JSON has one kind of number: `999.0` and `1e3` are whole numbers, as JSON
        // Schema's `integer` says, and are read as such (a field that takes a whole
        // number takes them too).
        const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;
        const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
        if v.fract() == 0.0 {
            if (0.0..TWO_POW_64).contains(&v) {
                return Ok(Strict(Value::from(v as u64)));
            }
            if (-TWO_POW_63..0.0).contains(&v) {
                return Ok(Strict(Value::from(v as i64)));
            }
        }
        Ok(Strict(
            serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number),
        ))
    }
    fn visit_str<E>(self, v: &str) -> Result<Strict, E> {
        Ok(Strict(Value::String(v.to_string())))
    }
    fn visit_string<E>(self, v: String) -> Result<Strict, E> {
        Ok(Strict(Value::String(v)))
    }
    fn visit_unit<E>(self) -> Result<Strict, E> {
        Ok(Strict(Value::Null))
    }
    fn visit_none<E>(self) -> Result<Strict, E> {
        Ok(Strict(Value::Null))
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Strict(Value::Array(out)))
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.contains_key(&k) {
                return Err(de::Error::custom(format!(
                    "the key {} appears twice in one object",
                    Value::from(k)
                )));
            }
            let Strict(v) = map.next_value()?;
            out.insert(k, v);
        }
        Ok(Strict(Value::Object(out)))
    }
}

/// What went wrong reading a parsed body into its type, kept structured until the
/// field's path is known.
#[derive(Debug)]
pub enum Error {
    /// A value of the wrong type: what was expected (serde's words), what came.
    Type(String, String),
    /// A value out of its range or set: what was expected, what came.
    Value(String, String),
    /// A field the type does not take, and those it does.
    Unknown(String, &'static [&'static str]),
    /// A required field that is absent.
    Missing(&'static str),
    /// Anything else (a type's own check).
    Other(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.sentence("", &[]))
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Error {
        Error::Other(msg.to_string())
    }
    fn invalid_type(unexp: Unexpected, exp: &dyn Expected) -> Error {
        Error::Type(exp.to_string(), unexpected(&unexp))
    }
    fn invalid_value(unexp: Unexpected, exp: &dyn Expected) -> Error {
        let got = match unexp {
            Unexpected::Str(s) => Value::from(s).to_string(),
            other => unexpected(&other),
        };
        Error::Value(exp.to_string(), got)
    }
    fn invalid_length(len: usize, exp: &dyn Expected) -> Error {
        Error::Value(exp.to_string(), format!("{len} items"))
    }
    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Error {
        Error::Value(
            format!("one of {}", expected.join(", ")),
            Value::from(variant).to_string(),
        )
    }
    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Error {
        Error::Unknown(field.to_string(), expected)
    }
    fn missing_field(field: &'static str) -> Error {
        Error::Missing(field)
    }
}

/// What came, in words; a number as itself (`not 2.5` where a whole number is due).
fn unexpected(u: &Unexpected) -> String {
    match u {
        Unexpected::Bool(b) => b.to_string(),
        Unexpected::Unsigned(n) => n.to_string(),
        Unexpected::Signed(n) => n.to_string(),
        // Debug form: `1e300` is shown as `1e300`, never as 300 digits.
        Unexpected::Float(n) => format!("{n:?}"),
        Unexpected::Char(_) | Unexpected::Str(_) => "a string".into(),
        Unexpected::Unit | Unexpected::Option => "null".into(),
        Unexpected::Seq => "a list".into(),
        Unexpected::Map | Unexpected::StructVariant => "an object".into(),
        _ => "another kind of value".into(),
    }
}

/// serde's name of an expected type in words.
fn expected(exp: &str) -> String {
    match exp {
        "a boolean" => "true or false".into(),
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number ≥ 0".into(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".into(),
        "f32" | "f64" | "a JSON number" => "a number".into(),
        "a string" | "a borrowed string" | "a character" => "a string".into(),
        "a sequence" => "a list".into(),
        "a map" | "any valid JSON value" => "an object".into(),
        e if e.starts_with("struct ") => "an object".into(),
        e => e.to_string(),
    }
}

impl Error {
    /// One sentence naming the field at `path` (empty: the body itself).
    pub fn sentence(&self, path: &str, hints: Hints) -> String {
        let hint_key: String = {
            // `files[3].name` → `files[].name`.
            let mut out = String::with_capacity(path.len());
            let mut skip = false;
            for c in path.chars() {
                match c {
                    '[' => {
                        skip = true;
                        out.push('[');
                    }
                    ']' => {
                        skip = false;
                        out.push(']');
                    }
                    c if !skip => out.push(c),
                    _ => {}
                }
            }
            out
        };
        let hint = |key: &str| hints.iter().find(|(k, _)| *k == key).map(|(_, w)| *w);
        let subject = if path.is_empty() { "the body" } else { path };
        match self {
            Error::Type(exp, got) => {
                let want = hint(&hint_key).map_or_else(|| expected(exp), str::to_string);
                format!("{subject} must be {want}, not {got}")
            }
            Error::Value(exp, got) => {
                let want = hint(&hint_key).map_or_else(|| expected(exp), str::to_string);
                format!("{subject} must be {want}; {got} is not")
            }
            Error::Unknown(field, known) => {
                let takes = if known.is_empty() {
                    "no fields".to_string()
                } else {
                    known.join(", ")
                };
                // The path already ends with the unknown key.
                let parent = path
                    .strip_suffix(field.as_str())
                    .map(|p| p.trim_end_matches('.'))
                    .unwrap_or(path);
                let within = if parent.is_empty() {
                    "the body".to_string()
                } else {
                    parent.to_string()
                };
                format!(
                    "unknown field {} in {within}; it takes {takes}",
                    Value::from(field.as_str())
                )
            }
            Error::Missing(field) => {
                let full = if path.is_empty() {
                    (*field).to_string()
                } else {
                    format!("{path}.{field}")
                };
                let key = if hint_key.is_empty() {
                    (*field).to_string()
                } else {
                    format!("{hint_key}.{field}")
                };
                match hint(&key) {
                    Some(w) => format!("{full} is required: {w}"),
                    None => format!("{full} is required"),
                }
            }
            Error::Other(m) if path.is_empty() => m.clone(),
            Error::Other(m) => format!("{path}: {m}"),
        }
    }
}

/// Reads a parsed [`Value`] into a type; a struct or map only from an object.
pub struct De<'a>(pub &'a Value);

impl<'de> de::Deserializer<'de> for De<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => v.visit_unit(),
            Value::Bool(b) => v.visit_bool(*b),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    v.visit_u64(u)
                } else if let Some(i) = n.as_i64() {
                    v.visit_i64(i)
                } else {
                    v.visit_f64(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Value::String(s) => v.visit_str(s),
            Value::Array(a) => v.visit_seq(Seq(a.iter())),
            Value::Object(m) => v.visit_map(Fields {
                iter: m.iter(),
                value: None,
            }),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => v.visit_none(),
            _ => v.visit_some(self),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_map(v)
    }

    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Object(_) => self.deserialize_any(v),
            other => Err(Error::Type("a map".into(), kind(other).into())),
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(_) => self.deserialize_any(v),
            other => Err(Error::Type("a sequence".into(), kind(other).into())),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, Error> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::String(s) => v.visit_enum(s.as_str().into_deserializer()),
            other => Err(Error::Type(
                format!("one of {}", variants.join(", ")),
                kind(other).into(),
            )),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct tuple tuple_struct identifier ignored_any
    }
}

struct Seq<'a>(std::slice::Iter<'a, Value>);

impl<'de> de::SeqAccess<'de> for Seq<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0.next().map(|v| seed.deserialize(De(v))).transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Fields<'a> {
    iter: serde_json::map::Iter<'a>,
    value: Option<&'a Value>,
}

impl<'de> de::MapAccess<'de> for Fields<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some((k, v)) = self.iter.next() else {
            return Ok(None);
        };
        self.value = Some(v);
        seed.deserialize(de::value::StrDeserializer::<Error>::new(k))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let v = self
            .value
            .take()
            .ok_or_else(|| Error::Other("a value was read before its key".into()))?;
        seed.deserialize(De(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Limits {
        wall_time_ms: Option<f64>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        name: String,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        language: Option<String>,
        limits: Option<Limits>,
        files: Option<Vec<File>>,
        network: Option<bool>,
        n: Option<serde_json::Number>,
        any: Option<Value>,
        k: Option<u32>,
    }

    const HINTS: Hints = &[("limits.wallTimeMs", "a number of milliseconds")];

    fn err(body: &str) -> String {
        decode::<Body>(body.as_bytes(), HINTS, false).unwrap_err()
    }

    #[test]
    fn whole_numbers_written_with_a_fraction_or_exponent_are_whole() {
        let m = parse_object(br#"{"a":999.0,"b":1e3,"c":-2.0,"d":2.5,"e":1e300}"#, false).unwrap();
        assert_eq!(m["a"].as_u64(), Some(999));
        assert_eq!(m["b"].as_u64(), Some(1000));
        assert_eq!(m["c"].as_i64(), Some(-2));
        assert_eq!(m["d"].as_f64(), Some(2.5));
        assert_eq!(m["e"].as_u64(), None);
        // Read exactly (serde_json's float_roundtrip): a whole number written with
        // `.0` below 2^53 stays whole (schemathesis found this one rounded off).
        let m = parse_object(br#"{"t":3989583129286382.0,"u":9007199254740992.0}"#, false).unwrap();
        assert_eq!(m["t"].as_u64(), Some(3_989_583_129_286_382));
        assert_eq!(m["u"].as_u64(), Some(9_007_199_254_740_992));
    }

    #[test]
    fn objects_are_read_and_everything_else_refused_in_words() {
        let b: Body = decode(
            br#"{"language":"py","limits":{"wallTimeMs":5},"files":[{"name":"a"}],"n":1.5,"any":[{"x":[1]}]}"#,
            HINTS,
            false,
        )
        .unwrap();
        assert_eq!(b.language.as_deref(), Some("py"));
        assert_eq!(b.limits.unwrap().wall_time_ms, Some(5.0));
        assert_eq!(b.files.unwrap()[0].name, "a");
        assert_eq!(b.any.unwrap(), serde_json::json!([{"x": [1]}]));

        assert_eq!(err(""), "the body is empty; send a JSON object");
        assert_eq!(err(" \n"), "the body is empty; send a JSON object");
        assert!(decode::<Body>(b"  ", HINTS, true).is_ok());
        assert_eq!(
            err(r#"["python",null,"print(1)"]"#),
            "the body must be a JSON object ({...}), not a list"
        );
        assert_eq!(
            err("7"),
            "the body must be a JSON object ({...}), not a number"
        );
        assert_eq!(
            err(r#"{"limits":[1000]}"#),
            "limits must be an object, not a list"
        );
        assert_eq!(
            err(r#"{"files":[["a"]]}"#),
            "files[0] must be an object, not a list"
        );
        assert_eq!(
            err(r#"{"limits":{"wallTimeMs":"5s"}}"#),
            "limits.wallTimeMs must be a number of milliseconds, not a string"
        );
        assert_eq!(
            err(r#"{"network":"yes"}"#),
            "network must be true or false, not a string"
        );
        assert_eq!(err(r#"{"language":5}"#), "language must be a string, not 5");
        assert_eq!(
            err(r#"{"network":1}"#),
            "network must be true or false, not 1"
        );
        assert_eq!(
            err(r#"{"language":true}"#),
            "language must be a string, not true"
        );
        assert_eq!(
            err(r#"{"files":{"name":"a"}}"#),
            "files must be a list, not an object"
        );
        assert_eq!(err(r#"{"files":[{}]}"#), "files[0].name is required");
        assert_eq!(err(r#"{"n":"1"}"#), "n must be a number, not a string");
        assert_eq!(err(r#"{"k":8.5}"#), "k must be a whole number ≥ 0, not 8.5");
        assert_eq!(
            err(r#"{"k":-1}"#),
            "k must be a whole number ≥ 0; -1 is not"
        );
        assert_eq!(
            err(r#"{"langauge":"py"}"#),
            "unknown field \"langauge\" in the body; it takes language, limits, files, network, n, any, k"
        );
        assert_eq!(
            err(r#"{"limits":{"wall":1}}"#),
            "unknown field \"wall\" in limits; it takes wallTimeMs"
        );
    }

    #[test]
    fn syntax_errors_and_repeated_keys_are_said_plainly() {
        assert_eq!(
            err(r#"{"language":"py",}"#),
            "the body is not valid JSON: a comma before a closing } or ] (JSON allows no trailing comma) (line 1, column 18)"
        );
        assert!(err(r#"{"language":"#).starts_with("the body is not valid JSON: it ends before"));
        assert!(err(r#"{"language":"py"} x"#).contains("there is more after the JSON object ends"));
        assert!(err("{'a':1}").contains("a key must be a string in double quotes"));
        assert!(err(r#"{"a":True}"#).contains("true, false and null are lower case"));
        assert_eq!(
            err(r#"{"language":"py","language":"go"}"#),
            "the body is not usable: the key \"language\" appears twice in one object (line 1, column 27)"
        );
        assert!(err(r#"{"any":{"x":1,"x":2}}"#).contains("appears twice"));
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(err(&format!(r#"{{"any":{deep}}}"#)).contains("more than 128 levels"));
    }
}

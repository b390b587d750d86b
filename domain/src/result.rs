//! Typed results: the JSON Schema an agent gives a task for what must come
//! back, in a subset a worker's form can show on a phone, and the check of
//! what a worker sends against it.
//!
//! The subset ([`ResultSchema::parse`]): the schema is an object
//! (`"type": "object"`) of at most [`MAX_FIELDS`] named fields
//! (`properties`), some of them `required`, with a `title` and a
//! `description`; extra fields in a result are refused
//! (`additionalProperties` is `false` whether or not the schema says so).
//! Each field has a `title` (the form's label), a `description` and one of
//! these types:
//!
//! - `string`, with `minLength`, `maxLength` (at most [`MAX_STRING_LENGTH`]),
//!   `pattern` (a regular expression without look-around or
//!   back-references, at most [`MAX_PATTERN_CHARS`] characters) or `enum`
//!   (at most [`MAX_ENUM_VALUES`] strings);
//! - `number` or `integer`, with `minimum` and `maximum`;
//! - `boolean`;
//! - `array` of choices: `items` is `{"type": "string", "enum": [...]}`,
//!   with `minItems`, `maxItems` and `uniqueItems`;
//! - `array` of photos: `items` is `{"type": "string", "format": "photo"}`,
//!   with `minItems` and `maxItems` (at most [`MAX_PHOTOS_PER_FIELD`]); the
//!   values are ids of photos uploaded for the task.
//!
//! Anything else is refused with the JSON pointer of what is unsupported,
//! so an agent learns at create what a worker could not fill in.

use serde_json::{Map, Value};

/// Fields of a schema, at most.
pub const MAX_FIELDS: usize = 50;
/// Choices of one `enum`, at most.
pub const MAX_ENUM_VALUES: usize = 100;
/// Characters of one `pattern`, at most.
pub const MAX_PATTERN_CHARS: usize = 500;
/// The largest `maxLength` of a string field (and the default one).
pub const MAX_STRING_LENGTH: u64 = 10_000;
/// Photos of one photo field, at most (and the default `maxItems`).
pub const MAX_PHOTOS_PER_FIELD: u64 = 20;
/// Bytes of a schema as JSON, at most.
pub const MAX_SCHEMA_BYTES: usize = 16 * 1024;
/// Characters of a title, and of a field's name, at most.
pub const MAX_TITLE_CHARS: usize = 200;
/// Characters of a description, at most.
pub const MAX_DESCRIPTION_CHARS: usize = 2_000;

/// What is wrong, and where: a JSON pointer into the schema (when it is
/// refused at create) or into the result (when a result is refused).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct FieldError {
    pub pointer: String,
    pub message: String,
}

impl FieldError {
    fn at(pointer: impl Into<String>, message: impl Into<String>) -> FieldError {
        FieldError {
            pointer: pointer.into(),
            message: message.into(),
        }
    }
}

/// The kind of a field, as the worker's form shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldKind {
    Text,
    Choice,
    Number,
    Integer,
    Boolean,
    Choices,
    Photos { min: u64, max: u64 },
}

/// One field of a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub kind: FieldKind,
    pub required: bool,
}

/// A result schema in the supported subset.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultSchema {
    /// The schema as the agent gave it, with `additionalProperties: false`.
    schema: Value,
    fields: Vec<Field>,
}

impl ResultSchema {
    /// Checks that `schema` is in the subset; every problem found, each at
    /// the pointer of what is unsupported, when it is not.
    pub fn parse(schema: &Value) -> Result<ResultSchema, Vec<FieldError>> {
        let size = serde_json::to_vec(schema).map_or(usize::MAX, |b| b.len());
        if size > MAX_SCHEMA_BYTES {
            return Err(vec![FieldError::at(
                "",
                format!("the schema is {size} bytes as JSON; at most {MAX_SCHEMA_BYTES}"),
            )]);
        }
        let mut problems = Vec::new();
        let Some(root) = schema.as_object() else {
            return Err(vec![FieldError::at("", "a result schema is a JSON object")]);
        };
        let known = [
            "type",
            "title",
            "description",
            "properties",
            "required",
            "additionalProperties",
            "$schema",
        ];
        unsupported_keywords(root, "", &known, &mut problems);
        if root.get("type") != Some(&Value::from("object")) {
            problems.push(FieldError::at(
                "/type",
                "the result is an object: \"type\": \"object\"",
            ));
        }
        annotations(root, "", &mut problems);
        match root.get("additionalProperties") {
            None | Some(Value::Bool(false)) => {}
            Some(_) => problems.push(FieldError::at(
                "/additionalProperties",
                "a result has only the fields the schema names: leave additionalProperties out or set it to false",
            )),
        }
        let mut fields = Vec::new();
        match root.get("properties") {
            Some(Value::Object(properties)) if !properties.is_empty() => {
                if properties.len() > MAX_FIELDS {
                    problems.push(FieldError::at(
                        "/properties",
                        format!("{} fields; at most {MAX_FIELDS}", properties.len()),
                    ));
                }
                for (name, field) in properties {
                    let at = format!("/properties/{}", escape(name));
                    if !valid_name(name) {
                        problems.push(FieldError::at(
                            &at,
                            format!(
                                "a field's name is 1 to {MAX_TITLE_CHARS} letters, digits, '_' or '-', starting with a letter"
                            ),
                        ));
                    }
                    if let Some(kind) = field_kind(field, &at, &mut problems) {
                        fields.push(Field {
                            name: name.clone(),
                            kind,
                            required: false,
                        });
                    }
                }
            }
            _ => problems.push(FieldError::at(
                "/properties",
                "a result schema names its fields in a non-empty \"properties\" object",
            )),
        }
        if let Some(required) = root.get("required") {
            match required.as_array() {
                Some(names) => {
                    for (i, name) in names.iter().enumerate() {
                        let at = format!("/required/{i}");
                        let Some(name) = name.as_str() else {
                            problems
                                .push(FieldError::at(at, "a required field is named by a string"));
                            continue;
                        };
                        match fields.iter_mut().find(|f| f.name == name) {
                            Some(f) if f.required => problems
                                .push(FieldError::at(at, format!("{name:?} is listed twice"))),
                            Some(f) => f.required = true,
                            None if root
                                .get("properties")
                                .and_then(Value::as_object)
                                .is_some_and(|p| p.contains_key(name)) => {}
                            None => problems.push(FieldError::at(
                                at,
                                format!("{name:?} is not one of the schema's properties"),
                            )),
                        }
                    }
                }
                None => problems.push(FieldError::at(
                    "/required",
                    "\"required\" is an array of field names",
                )),
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let mut schema = schema.clone();
        schema["additionalProperties"] = Value::Bool(false);
        // What the checker's engine refuses (a pattern it cannot compile).
        #[cfg(feature = "results")]
        if let Err(e) = validator(&schema) {
            return Err(vec![FieldError::at(
                e.instance_path().to_string(),
                bounded(e.to_string()),
            )]);
        }
        Ok(ResultSchema { schema, fields })
    }

    /// The schema, as stored and shown (with `additionalProperties: false`).
    pub fn as_json(&self) -> &Value {
        &self.schema
    }

    /// The fields, in the order of the schema's map (by name: the JSON
    /// reader keeps no key order).
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// Checks a worker's `result` against the schema: its shape (with a
    /// JSON Schema validator), then that every photo field names photos
    /// uploaded for this task (`photos`), each once. Every problem found,
    /// each at its pointer into the result, when it does not fit.
    #[cfg(feature = "results")]
    pub fn check(&self, result: &Value, photos: &[uuid::Uuid]) -> Result<(), Vec<FieldError>> {
        let validator = validator(&self.schema)
            .map_err(|e| vec![FieldError::at("", format!("the task's result schema: {e}"))])?;
        let mut problems: Vec<FieldError> = validator
            .iter_errors(result)
            .map(|e| FieldError::at(e.instance_path().to_string(), bounded(e.to_string())))
            .collect();
        for field in &self.fields {
            if !matches!(field.kind, FieldKind::Photos { .. }) {
                continue;
            }
            let Some(ids) = result.get(&field.name).and_then(Value::as_array) else {
                continue;
            };
            let mut seen = Vec::new();
            for (i, id) in ids.iter().enumerate() {
                let at = format!("/{}/{i}", escape(&field.name));
                let Some(id) = id.as_str().and_then(|s| uuid::Uuid::parse_str(s).ok()) else {
                    problems.push(FieldError::at(
                        at,
                        "a photo is named by the id its upload answered",
                    ));
                    continue;
                };
                if !photos.contains(&id) {
                    problems.push(FieldError::at(
                        at,
                        format!("{id} is not a photo of this task"),
                    ));
                } else if seen.contains(&id) {
                    problems.push(FieldError::at(at, format!("{id} is listed twice")));
                }
                seen.push(id);
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

/// A field's kind, or `None` with its problems recorded.
fn field_kind(field: &Value, at: &str, problems: &mut Vec<FieldError>) -> Option<FieldKind> {
    let Some(field) = field.as_object() else {
        problems.push(FieldError::at(at, "a field is described by an object"));
        return None;
    };
    let before = problems.len();
    annotations(field, at, problems);
    let kind = match field.get("type").and_then(Value::as_str) {
        Some("string") => {
            unsupported_keywords(
                field,
                at,
                &[
                    "type",
                    "title",
                    "description",
                    "minLength",
                    "maxLength",
                    "pattern",
                    "enum",
                ],
                problems,
            );
            bounds(
                field,
                at,
                "minLength",
                "maxLength",
                MAX_STRING_LENGTH,
                problems,
            );
            if let Some(pattern) = field.get("pattern") {
                check_pattern(pattern, &format!("{at}/pattern"), problems);
            }
            match field.get("enum") {
                Some(choices) => {
                    string_choices(choices, &format!("{at}/enum"), problems);
                    FieldKind::Choice
                }
                None => FieldKind::Text,
            }
        }
        Some(t @ ("number" | "integer")) => {
            unsupported_keywords(
                field,
                at,
                &["type", "title", "description", "minimum", "maximum"],
                problems,
            );
            let number = |key: &str, problems: &mut Vec<FieldError>| match field.get(key) {
                None => None,
                Some(Value::Number(n)) => n.as_f64(),
                Some(_) => {
                    problems.push(FieldError::at(
                        format!("{at}/{key}"),
                        format!("{key} is a number"),
                    ));
                    None
                }
            };
            if let (Some(min), Some(max)) =
                (number("minimum", problems), number("maximum", problems))
                && min > max
            {
                problems.push(FieldError::at(
                    format!("{at}/minimum"),
                    "minimum is above maximum",
                ));
            }
            if t == "number" {
                FieldKind::Number
            } else {
                FieldKind::Integer
            }
        }
        Some("boolean") => {
            unsupported_keywords(field, at, &["type", "title", "description"], problems);
            FieldKind::Boolean
        }
        Some("array") => {
            let items_at = format!("{at}/items");
            let items = field.get("items").and_then(Value::as_object);
            // An array holds photos (counted up to their own limit) or
            // choices (which may be required to differ).
            let photos = items.is_some_and(|i| i.get("format") == Some(&Value::from("photo")));
            let (item_keywords, extra, limit, wrong_type) = if photos {
                (
                    ["type", "format"],
                    None,
                    MAX_PHOTOS_PER_FIELD,
                    "a photo is named by its id: \"type\": \"string\"",
                )
            } else {
                (
                    ["type", "enum"],
                    Some("uniqueItems"),
                    MAX_ENUM_VALUES as u64,
                    "an array field holds choices (\"type\": \"string\" with \"enum\") or photos (\"format\": \"photo\")",
                )
            };
            let mut keywords = vec![
                "type",
                "title",
                "description",
                "items",
                "minItems",
                "maxItems",
            ];
            keywords.extend(extra);
            unsupported_keywords(field, at, &keywords, problems);
            let (min, max) = bounds(field, at, "minItems", "maxItems", limit, problems);
            if field.get("uniqueItems").is_some_and(|u| !u.is_boolean()) {
                problems.push(FieldError::at(
                    format!("{at}/uniqueItems"),
                    "uniqueItems is true or false",
                ));
            }
            match items {
                None => problems.push(FieldError::at(
                    &items_at,
                    "an array field says what it holds in \"items\"",
                )),
                Some(items) => {
                    unsupported_keywords(items, &items_at, &item_keywords, problems);
                    if items.get("type") != Some(&Value::from("string")) {
                        problems.push(FieldError::at(format!("{items_at}/type"), wrong_type));
                    } else if !photos {
                        match items.get("enum") {
                            Some(choices) => {
                                string_choices(choices, &format!("{items_at}/enum"), problems)
                            }
                            None => problems.push(FieldError::at(
                                &items_at,
                                "an array field holds choices (\"enum\") or photos (\"format\": \"photo\")",
                            )),
                        }
                    }
                }
            }
            if photos {
                FieldKind::Photos {
                    min: min.unwrap_or(0),
                    max: max.unwrap_or(MAX_PHOTOS_PER_FIELD),
                }
            } else {
                FieldKind::Choices
            }
        }
        Some(other) => {
            problems.push(FieldError::at(
                format!("{at}/type"),
                format!(
                    "a field's type is string, number, integer, boolean or array, not {other:?}"
                ),
            ));
            return None;
        }
        None => {
            problems.push(FieldError::at(
                format!("{at}/type"),
                "a field names its type",
            ));
            return None;
        }
    };
    (problems.len() == before).then_some(kind)
}

/// Records every keyword of `object` that is not in `known`.
fn unsupported_keywords(
    object: &Map<String, Value>,
    at: &str,
    known: &[&str],
    problems: &mut Vec<FieldError>,
) {
    for key in object.keys().filter(|k| !known.contains(&k.as_str())) {
        problems.push(FieldError::at(
            format!("{at}/{}", escape(key)),
            format!(
                "{key:?} is not supported here (supported: {})",
                known.join(", ")
            ),
        ));
    }
}

/// `title` and `description`: strings of bounded length.
fn annotations(object: &Map<String, Value>, at: &str, problems: &mut Vec<FieldError>) {
    for (key, max) in [
        ("title", MAX_TITLE_CHARS),
        ("description", MAX_DESCRIPTION_CHARS),
    ] {
        match object.get(key) {
            None => {}
            Some(Value::String(s)) if s.chars().count() <= max => {}
            Some(Value::String(_)) => problems.push(FieldError::at(
                format!("{at}/{key}"),
                format!("a {key} is at most {max} characters"),
            )),
            Some(_) => problems.push(FieldError::at(
                format!("{at}/{key}"),
                format!("a {key} is a string"),
            )),
        }
    }
}

/// A pair of count bounds: non-negative integers, the lower not above the
/// upper, the upper at most `limit`.
fn bounds(
    object: &Map<String, Value>,
    at: &str,
    low: &str,
    high: &str,
    limit: u64,
    problems: &mut Vec<FieldError>,
) -> (Option<u64>, Option<u64>) {
    let mut read = |key: &str| match object.get(key) {
        None => None,
        Some(v) => match v.as_u64() {
            Some(n) if n <= limit => Some(n),
            _ => {
                problems.push(FieldError::at(
                    format!("{at}/{key}"),
                    format!("{key} is a whole number from 0 to {limit}"),
                ));
                None
            }
        },
    };
    let (min, max) = (read(low), read(high));
    if let (Some(min), Some(max)) = (min, max)
        && min > max
    {
        problems.push(FieldError::at(
            format!("{at}/{low}"),
            format!("{low} is above {high}"),
        ));
    }
    (min, max)
}

/// The choices of an `enum`: distinct strings, at least one.
fn string_choices(choices: &Value, at: &str, problems: &mut Vec<FieldError>) {
    let Some(choices) = choices.as_array().filter(|c| !c.is_empty()) else {
        problems.push(FieldError::at(
            at,
            "\"enum\" is a non-empty array of strings",
        ));
        return;
    };
    if choices.len() > MAX_ENUM_VALUES {
        problems.push(FieldError::at(
            at,
            format!("{} choices; at most {MAX_ENUM_VALUES}", choices.len()),
        ));
    }
    for (i, choice) in choices.iter().enumerate() {
        match choice.as_str() {
            None => problems.push(FieldError::at(format!("{at}/{i}"), "a choice is a string")),
            Some(s) if choices[..i].iter().any(|c| c.as_str() == Some(s)) => problems.push(
                FieldError::at(format!("{at}/{i}"), format!("{s:?} is listed twice")),
            ),
            Some(s) if s.chars().count() > MAX_TITLE_CHARS => problems.push(FieldError::at(
                format!("{at}/{i}"),
                format!("a choice is at most {MAX_TITLE_CHARS} characters"),
            )),
            Some(_) => {}
        }
    }
}

/// A pattern the checker's engine runs in linear time: bounded, and
/// without look-around or back-references (which would need backtracking).
fn check_pattern(pattern: &Value, at: &str, problems: &mut Vec<FieldError>) {
    let Some(pattern) = pattern.as_str() else {
        problems.push(FieldError::at(at, "a pattern is a string"));
        return;
    };
    if pattern.chars().count() > MAX_PATTERN_CHARS {
        problems.push(FieldError::at(
            at,
            format!("a pattern is at most {MAX_PATTERN_CHARS} characters"),
        ));
        return;
    }
    if ["(?=", "(?!", "(?<=", "(?<!"]
        .iter()
        .any(|l| pattern.contains(l))
        || pattern
            .as_bytes()
            .windows(2)
            .any(|w| w[0] == b'\\' && w[1].is_ascii_digit() && w[1] != b'0')
    {
        problems.push(FieldError::at(
            at,
            "look-around and back-references are not supported",
        ));
    }
}

/// A field name: what a form's input can be named.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.chars().count() <= MAX_TITLE_CHARS
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A key as one JSON pointer token (RFC 6901).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The JSON Schema validator of a schema: formats are not checked (a
/// photo field's are, by [`ResultSchema::check`]), and patterns run on a
/// linear-time engine, so no result can make a check take exponential time.
#[cfg(feature = "results")]
fn validator(
    schema: &Value,
) -> Result<jsonschema::Validator, jsonschema::ValidationError<'static>> {
    jsonschema::options()
        .should_validate_formats(false)
        .with_pattern_options(jsonschema::PatternOptions::regex().size_limit(1 << 20))
        .build(schema)
}

/// A validator's message, bounded: it may quote the worker's value.
#[cfg(feature = "results")]
fn bounded(message: String) -> String {
    const MAX: usize = 300;
    match message.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &message[..cut]),
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Every supported type, once.
    fn every_type() -> Value {
        json!({
            "type": "object",
            "title": "Gate check",
            "description": "What you found at the gate.",
            "properties": {
                "locked": {"type": "boolean", "title": "Was the gate locked?"},
                "note": {"type": "string", "maxLength": 500, "minLength": 1},
                "plate": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
                "colour": {"type": "string", "enum": ["red", "green", "blue"]},
                "queue": {"type": "integer", "minimum": 0, "maximum": 500},
                "price": {"type": "number", "minimum": 0.5},
                "signs": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["open", "closed", "sale"]},
                    "minItems": 1,
                    "uniqueItems": true
                },
                "photos": {
                    "type": "array",
                    "items": {"type": "string", "format": "photo"},
                    "minItems": 1,
                    "maxItems": 3
                }
            },
            "required": ["locked", "photos"]
        })
    }

    fn refused(schema: Value) -> Vec<String> {
        ResultSchema::parse(&schema)
            .expect_err("refused")
            .into_iter()
            .map(|p| p.pointer)
            .collect()
    }

    #[test]
    fn every_supported_type_is_accepted_with_its_kind() {
        let schema = ResultSchema::parse(&every_type()).expect("in the subset");
        let kinds: Vec<_> = schema
            .fields()
            .iter()
            .map(|f| (f.name.as_str(), f.kind.clone(), f.required))
            .collect();
        assert_eq!(
            kinds,
            [
                ("colour", FieldKind::Choice, false),
                ("locked", FieldKind::Boolean, true),
                ("note", FieldKind::Text, false),
                ("photos", FieldKind::Photos { min: 1, max: 3 }, true),
                ("plate", FieldKind::Text, false),
                ("price", FieldKind::Number, false),
                ("queue", FieldKind::Integer, false),
                ("signs", FieldKind::Choices, false),
            ]
        );
        assert_eq!(schema.as_json()["additionalProperties"], false);
    }

    #[test]
    fn unsupported_keywords_and_types_are_refused_where_they_are() {
        let mut s = every_type();
        s["properties"]["note"]["format"] = json!("email");
        s["properties"]["nested"] = json!({"type": "object", "properties": {}});
        s["properties"]["queue"]["multipleOf"] = json!(5);
        s["properties"]["signs"]["items"]["minLength"] = json!(1);
        s["allOf"] = json!([]);
        assert_eq!(
            refused(s),
            [
                "/allOf",
                "/properties/nested/type",
                "/properties/note/format",
                "/properties/queue/multipleOf",
                "/properties/signs/items/minLength",
            ]
        );
    }

    #[test]
    fn the_root_must_be_an_object_of_named_fields() {
        assert_eq!(refused(json!([])), [""]);
        assert_eq!(refused(json!({"type": "string"})), ["/type", "/properties"]);
        assert_eq!(
            refused(json!({"type": "object", "properties": {}})),
            ["/properties"]
        );
        assert_eq!(
            refused(
                json!({"type": "object", "properties": {"a": {"type": "boolean"}},
                "additionalProperties": true})
            ),
            ["/additionalProperties"]
        );
        assert_eq!(
            refused(json!({"type": "object", "properties": {"a/b": {"type": "boolean"}}})),
            ["/properties/a~1b"]
        );
    }

    #[test]
    fn bounds_choices_and_requirements_are_checked() {
        let field = |f: Value| json!({"type": "object", "properties": {"f": f}});
        for (bad, pointer) in [
            (
                field(json!({"type": "string", "minLength": 5, "maxLength": 2})),
                "/properties/f/minLength",
            ),
            (
                field(json!({"type": "string", "maxLength": 1_000_000})),
                "/properties/f/maxLength",
            ),
            (
                field(json!({"type": "string", "enum": []})),
                "/properties/f/enum",
            ),
            (
                field(json!({"type": "string", "enum": ["a", "a"]})),
                "/properties/f/enum/1",
            ),
            (
                field(json!({"type": "integer", "minimum": 3, "maximum": 1})),
                "/properties/f/minimum",
            ),
            (
                field(json!({"type": "number", "maximum": "ten"})),
                "/properties/f/maximum",
            ),
            (
                field(json!({"type": "array", "items": {"type": "integer"}})),
                "/properties/f/items/type",
            ),
            (field(json!({"type": "array"})), "/properties/f/items"),
            (
                field(
                    json!({"type": "array", "items": {"type": "string", "format": "photo"}, "maxItems": 21}),
                ),
                "/properties/f/maxItems",
            ),
            (
                field(json!({"type": "string", "title": 7})),
                "/properties/f/title",
            ),
            (
                field(json!({"type": "string", "pattern": "(?=a)"})),
                "/properties/f/pattern",
            ),
            (
                field(json!({"type": "string", "pattern": "(a)\\1"})),
                "/properties/f/pattern",
            ),
        ] {
            assert_eq!(refused(bad.clone()), [pointer], "{bad}");
        }
        let mut s = every_type();
        s["required"] = json!(["locked", "missing", "locked", 3]);
        assert_eq!(refused(s), ["/required/1", "/required/2", "/required/3"]);
    }

    #[test]
    fn a_large_schema_is_refused_before_it_is_read() {
        let properties: Map<String, Value> = (0..400)
            .map(|i| {
                (
                    format!("f{i}"),
                    json!({"type": "string", "description": "x".repeat(40)}),
                )
            })
            .collect();
        let problems =
            ResultSchema::parse(&json!({"type": "object", "properties": properties})).unwrap_err();
        assert_eq!(problems.len(), 1);
        assert!(problems[0].message.contains("bytes"), "{problems:?}");
    }

    #[cfg(feature = "results")]
    mod checks {
        use uuid::Uuid;

        use super::*;

        fn problems(result: Value, photos: &[Uuid]) -> Vec<String> {
            ResultSchema::parse(&every_type())
                .unwrap()
                .check(&result, photos)
                .expect_err("refused")
                .into_iter()
                .map(|p| p.pointer)
                .collect()
        }

        #[test]
        fn a_result_that_fits_passes() {
            let photo = Uuid::from_u128(7);
            let schema = ResultSchema::parse(&every_type()).unwrap();
            let result = json!({
                "locked": true, "note": "chained", "plate": "AB123", "colour": "red",
                "queue": 12, "price": 2.5, "signs": ["open"], "photos": [photo]
            });
            assert_eq!(schema.check(&result, &[photo]), Ok(()));
        }

        #[test]
        fn each_misfit_is_reported_at_its_pointer() {
            let photo = Uuid::from_u128(7);
            let mut got = problems(
                json!({
                    "locked": "yes", "note": "", "plate": "ab123", "colour": "pink",
                    "queue": 1.5, "price": 0, "signs": ["open", "open"], "photos": [photo],
                    "extra": 1
                }),
                &[photo],
            );
            got.sort();
            assert_eq!(
                got,
                [
                    "", "/colour", "/locked", "/note", "/plate", "/price", "/queue", "/signs"
                ]
            );
        }

        #[test]
        fn photo_fields_count_and_name_this_tasks_photos() {
            let (mine, other) = (Uuid::from_u128(7), Uuid::from_u128(8));
            assert_eq!(
                problems(json!({"locked": false, "photos": []}), &[mine]),
                ["/photos"]
            );
            assert_eq!(
                problems(json!({"locked": false, "photos": [other]}), &[mine]),
                ["/photos/0"]
            );
            assert_eq!(
                problems(json!({"locked": false, "photos": [mine, mine]}), &[mine]),
                ["/photos/1"]
            );
            assert_eq!(
                problems(json!({"locked": false, "photos": ["not-an-id"]}), &[mine]),
                ["/photos/0"]
            );
            assert_eq!(
                problems(
                    json!({"locked": false, "photos": [mine, mine, mine, mine]}),
                    &[mine]
                ),
                ["/photos", "/photos/1", "/photos/2", "/photos/3"]
            );
            assert_eq!(problems(json!({"photos": [mine]}), &[mine]), [""]);
        }

        #[test]
        fn a_long_value_is_not_echoed_in_full() {
            let long = "x".repeat(5_000);
            let schema = ResultSchema::parse(&every_type()).unwrap();
            let got = schema
                .check(&json!({"locked": true, "note": long, "photos": []}), &[])
                .unwrap_err();
            assert!(
                got.iter().all(|p| p.message.chars().count() <= 301),
                "{got:?}"
            );
        }
    }
}

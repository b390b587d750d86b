//! A task's result schema as the worker's form: one input per field, the
//! right kind for each type (a yes/no choice, a list, checkboxes, a number
//! pad, the task's photos to pick from), labelled with the field's title;
//! and the posted form read back into the result the schema describes.
//!
//! The form posts each field as `r.<name>` (repeated for the fields that
//! hold several values). What the browser checks (required, bounds,
//! patterns) the server checks again against the schema.

use meatspace_domain::result::{FieldError, FieldKind, ResultSchema};
use serde_json::{Map, Value};
use uuid::Uuid;

/// Prefix of a result field's name in the posted form.
pub const PREFIX: &str = "r.";

/// One input of the form, ready for the template.
#[derive(Debug, Clone)]
pub struct FormField {
    /// The form control's name (`r.<field>`).
    pub name: String,
    /// The element id (`result-<n>`), for the label.
    pub id: String,
    pub label: String,
    pub hint: String,
    /// `text`, `textarea`, `number`, `integer`, `boolean`, `choice`,
    /// `choices` or `photos`.
    pub kind: &'static str,
    pub required: bool,
    /// What the person had typed (text and numbers).
    pub value: String,
    /// Choices, or the task's photos, with what was picked.
    pub options: Vec<FormOption>,
    pub min: String,
    pub max: String,
    pub max_length: String,
    pub pattern: String,
    pub error: Option<String>,
}

/// One choice of a list or a set of checkboxes.
#[derive(Debug, Clone)]
pub struct FormOption {
    pub value: String,
    pub label: String,
    pub checked: bool,
}

/// The inputs of `schema`'s form, refilled with `typed` (the posted pairs
/// of a refused submission) and carrying `errors` next to their fields.
/// `photos` are the photos the worker sent for the task, oldest first.
pub fn fields(
    schema: &ResultSchema,
    photos: &[Uuid],
    typed: &[(String, String)],
    errors: &[FieldError],
) -> Vec<FormField> {
    let properties = &schema.as_json()["properties"];
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(n, field)| {
            let spec = &properties[&field.name];
            let posted = posted_values(typed, &field.name);
            let text = |key: &str| match &spec[key] {
                Value::Null => String::new(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let choices = |values: &Value| -> Vec<FormOption> {
                values
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(|v| FormOption {
                        value: v.to_owned(),
                        label: v.to_owned(),
                        checked: posted.contains(&v),
                    })
                    .collect()
            };
            let (kind, options) = match &field.kind {
                FieldKind::Choice => ("choice", choices(&spec["enum"])),
                // A long text gets room to write in.
                FieldKind::Text if spec["maxLength"].as_u64().is_none_or(|n| n > 200) => {
                    ("textarea", Vec::new())
                }
                FieldKind::Text => ("text", Vec::new()),
                FieldKind::Number => ("number", Vec::new()),
                FieldKind::Integer => ("integer", Vec::new()),
                FieldKind::Boolean => (
                    "boolean",
                    [("true", "Yes"), ("false", "No")]
                        .into_iter()
                        .map(|(v, l)| FormOption {
                            value: v.to_owned(),
                            label: l.to_owned(),
                            checked: posted.contains(&v),
                        })
                        .collect(),
                ),
                FieldKind::Choices => ("choices", choices(&spec["items"]["enum"])),
                FieldKind::Photos { .. } => (
                    "photos",
                    photos
                        .iter()
                        .enumerate()
                        .map(|(i, id)| {
                            let value = id.to_string();
                            FormOption {
                                checked: posted.contains(&value.as_str()),
                                label: format!("Photo {}", i + 1),
                                value,
                            }
                        })
                        .collect(),
                ),
            };
            let pointer = format!("/{}", escape_pointer(&field.name));
            let error = errors
                .iter()
                .filter(|e| e.pointer == pointer || e.pointer.starts_with(&format!("{pointer}/")))
                .map(|e| e.message.clone())
                .reduce(|a, b| format!("{a} {b}"));
            let mut hint = text("description");
            if let FieldKind::Photos { min, max } = field.kind {
                let count = if min == max {
                    format!("Pick {min}.")
                } else {
                    format!("Pick {min} to {max}.")
                };
                hint = format!(
                    "{hint} {count} Send photos with the photo form above first; they appear here."
                )
                .trim()
                .to_owned();
            }
            FormField {
                id: format!("result-{n}"),
                label: Some(text("title"))
                    .filter(|t| !t.is_empty())
                    .unwrap_or_else(|| field.name.clone()),
                hint,
                kind,
                required: field.required,
                value: posted.first().map(|v| (*v).to_owned()).unwrap_or_default(),
                options,
                min: text("minimum"),
                max: text("maximum"),
                max_length: text("maxLength"),
                pattern: text("pattern"),
                error,
                name: format!("{PREFIX}{}", field.name),
            }
        })
        .collect()
}

/// The values posted for the result field `field` (its inputs are named
/// with [`PREFIX`]), in the order the form sent them.
fn posted_values<'a>(pairs: &'a [(String, String)], field: &str) -> Vec<&'a str> {
    let name = format!("{PREFIX}{field}");
    pairs
        .iter()
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// The result the posted `pairs` hold, typed as `schema` says: numbers
/// parsed, yes/no as booleans, repeated names as lists, empty inputs left
/// out. A value that is not a number is refused at its field's pointer;
/// everything else is the schema check's to judge.
pub fn result_of(
    schema: &ResultSchema,
    pairs: &[(String, String)],
) -> Result<Value, Vec<FieldError>> {
    let mut result = Map::new();
    let mut errors = Vec::new();
    for field in schema.fields() {
        let values = posted_values(pairs, &field.name);
        let single = values.first().map(|v| v.trim()).filter(|v| !v.is_empty());
        let pointer = format!("/{}", escape_pointer(&field.name));
        let value = match &field.kind {
            FieldKind::Choices | FieldKind::Photos { .. } => {
                if values.is_empty() && !field.required {
                    continue;
                }
                Value::Array(values.iter().map(|v| Value::from(*v)).collect())
            }
            _ => {
                let Some(v) = single else { continue };
                match &field.kind {
                    FieldKind::Boolean => Value::Bool(v == "true"),
                    FieldKind::Integer => match v.parse::<i64>() {
                        Ok(n) => Value::from(n),
                        Err(_) => {
                            errors.push(FieldError {
                                pointer,
                                message: "enter a whole number".into(),
                            });
                            continue;
                        }
                    },
                    FieldKind::Number => match v.parse::<f64>().ok().filter(|n| n.is_finite()) {
                        Some(n) => Value::from(n),
                        None => {
                            errors.push(FieldError {
                                pointer,
                                message: "enter a number".into(),
                            });
                            continue;
                        }
                    },
                    _ => Value::from(v),
                }
            }
        };
        result.insert(field.name.clone(), value);
    }
    if errors.is_empty() {
        Ok(Value::Object(result))
    } else {
        Err(errors)
    }
}

/// A result as the form's posted pairs: what the form shows again when the
/// agent asks for a revision, so the worker changes only what it must.
pub fn pairs_of(result: &Value) -> Vec<(String, String)> {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let Value::Object(fields) = result else {
        return Vec::new();
    };
    fields
        .iter()
        .flat_map(|(name, value)| {
            let name = format!("{PREFIX}{name}");
            match value {
                Value::Array(items) => items.iter().map(|v| (name.clone(), text(v))).collect(),
                v => vec![(name, text(v))],
            }
        })
        .collect()
}

/// `name` as one JSON pointer token (RFC 6901).
fn escape_pointer(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> ResultSchema {
        ResultSchema::parse(&json!({
            "type": "object",
            "properties": {
                "locked": { "type": "boolean", "title": "Locked?" },
                "queue": { "type": "integer", "minimum": 0 },
                "price": { "type": "number" },
                "colour": { "type": "string", "enum": ["red", "green"] },
                "signs": { "type": "array", "items": { "type": "string", "enum": ["open", "sale"] } },
                "photos": { "type": "array", "items": { "type": "string", "format": "photo" },
                            "minItems": 1, "maxItems": 2 },
                "note": { "type": "string", "maxLength": 100 }
            },
            "required": ["locked", "photos"]
        }))
        .expect("in the subset")
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_posted_form_becomes_the_typed_result() {
        let got = result_of(
            &schema(),
            &pairs(&[
                ("r.locked", "false"),
                ("r.queue", " 4 "),
                ("r.price", "2.5"),
                ("r.colour", "green"),
                ("r.signs", "open"),
                ("r.signs", "sale"),
                ("r.photos", "p1"),
                ("r.note", ""),
                ("csrf", "x"),
            ]),
        );
        assert_eq!(
            got,
            Ok(
                json!({ "locked": false, "queue": 4, "price": 2.5, "colour": "green",
                       "signs": ["open", "sale"], "photos": ["p1"] })
            )
        );
        // Nothing ticked: a required list is sent empty (for the schema to
        // refuse), an optional one left out.
        assert_eq!(
            result_of(&schema(), &pairs(&[("r.locked", "true")])),
            Ok(json!({ "locked": true, "photos": [] }))
        );
    }

    #[test]
    fn a_result_refills_the_form_it_came_from() {
        let result = json!({ "locked": false, "queue": 4, "price": 2.5, "colour": "green",
                             "signs": ["open", "sale"], "photos": ["p1"] });
        assert_eq!(result_of(&schema(), &pairs_of(&result)), Ok(result));
    }

    #[test]
    fn numbers_that_are_not_numbers_are_refused_at_their_field() {
        let errors = result_of(
            &schema(),
            &pairs(&[("r.queue", "four"), ("r.price", "NaN")]),
        )
        .expect_err("refused");
        let at: Vec<&str> = errors.iter().map(|e| e.pointer.as_str()).collect();
        assert_eq!(at, ["/price", "/queue"]);
    }

    #[test]
    fn each_type_gets_its_input_refilled_with_what_was_typed() {
        let photo = Uuid::from_u128(1);
        let typed = pairs(&[
            ("r.colour", "red"),
            ("r.queue", "3"),
            ("r.photos", &photo.to_string()),
        ]);
        let errors = [FieldError {
            pointer: "/queue".into(),
            message: "too many".into(),
        }];
        let form = fields(&schema(), &[photo], &typed, &errors);
        let kinds: Vec<(&str, &str)> = form.iter().map(|f| (f.name.as_str(), f.kind)).collect();
        assert_eq!(
            kinds,
            [
                ("r.colour", "choice"),
                ("r.locked", "boolean"),
                ("r.note", "text"),
                ("r.photos", "photos"),
                ("r.price", "number"),
                ("r.queue", "integer"),
                ("r.signs", "choices"),
            ]
        );
        let by = |n: &str| form.iter().find(|f| f.name == n).expect("field");
        assert_eq!(by("r.locked").label, "Locked?");
        assert!(
            by("r.colour")
                .options
                .iter()
                .any(|o| o.value == "red" && o.checked)
        );
        assert_eq!(by("r.queue").value, "3");
        assert_eq!(by("r.queue").min, "0");
        assert_eq!(by("r.queue").error.as_deref(), Some("too many"));
        assert!(by("r.photos").options[0].checked);
        assert!(by("r.photos").hint.contains("Pick 1 to 2."));
    }
}

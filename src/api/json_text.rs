//! Edits of a JSON text that keep every byte they do not change: an object's members and
//! where they lie, a member set, added or removed, an item put first in an array. For
//! the answer and request rewriters, which must leave what they do not touch as received.

use std::ops::Range;

use serde_json::value::RawValue;

/// One member of an object: its name and where its key and value lie in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The member's name, unescaped.
    pub name: String,
    /// Where its key's opening quote is.
    pub key_start: usize,
    /// Where its value lies.
    pub value: Range<usize>,
}

/// A JSON object's members in order (duplicates kept), as they lie in its text.
#[derive(Debug, Clone)]
pub struct Object {
    /// The members, in order.
    pub members: Vec<Member>,
    /// Where the opening brace is.
    pub open: usize,
}

impl Object {
    /// Reads `text` (one JSON value, whitespace around it allowed) as an object; `None`
    /// when it is not valid JSON or not an object.
    pub fn parse(text: &str) -> Option<Self> {
        let open = text.len() - text.trim_start().len();
        if !text[open..].starts_with('{') {
            return None;
        }
        let raws: super::Fields<'_> = serde_json::from_str(text).ok()?;
        let mut members = Vec::with_capacity(raws.0.len());
        let mut after = open + 1;
        for (name, raw) in raws.0 {
            let value = range_of(text, raw)?;
            // Between the previous value (or the brace) and a key: whitespace and a comma.
            let gap = text.get(after..value.start)?;
            let key_start = after + gap.find('"')?;
            after = value.end;
            members.push(Member { name, key_start, value });
        }
        Some(Self { members, open })
    }

    /// The last member named `name` (the one a parser keeps).
    pub fn get(&self, name: &str) -> Option<&Member> {
        self.members.iter().rev().find(|m| m.name == name)
    }

    /// The text of the last member named `name`'s value.
    pub fn value<'t>(&self, text: &'t str, name: &str) -> Option<&'t str> {
        text.get(self.get(name)?.value.clone())
    }
}

/// The byte range of `raw` in `text`, when `raw` was borrowed from it.
fn range_of(text: &str, raw: &RawValue) -> Option<Range<usize>> {
    super::range_in(text.as_bytes(), raw)
}

/// The items of a JSON array text as borrowed raw values with their ranges in `text`;
/// `None` when `text` is not an array.
pub fn array_items(text: &str) -> Option<Vec<(&str, Range<usize>)>> {
    let raws: Vec<&RawValue> = serde_json::from_str(text).ok()?;
    raws.into_iter().map(|raw| Some((raw.get(), range_of(text, raw)?))).collect()
}

/// `text` with `range` replaced by `with`.
pub fn splice(text: &str, range: Range<usize>, with: &str) -> Option<String> {
    let (head, tail) = (text.get(..range.start)?, text.get(range.end..)?);
    let mut out = String::with_capacity(head.len() + with.len() + tail.len());
    out.push_str(head);
    out.push_str(with);
    out.push_str(tail);
    Some(out)
}

/// The object `text` with member `name` set to the JSON text `value`: the last member of
/// that name has its value replaced, else the member is added after the last one.
pub fn set_member(text: &str, name: &str, value: &str) -> Option<String> {
    let object = Object::parse(text)?;
    if let Some(member) = object.get(name) {
        return splice(text, member.value.clone(), value);
    }
    let key = serde_json::to_string(name).ok()?;
    match object.members.last() {
        Some(last) => splice(text, last.value.end..last.value.end, &format!(",{key}:{value}")),
        None => splice(text, object.open + 1..object.open + 1, &format!("{key}:{value}")),
    }
}

/// The object `text` without its members named `name` (every other byte as received);
/// `None` when it has none or is not an object.
pub fn remove_members(text: &str, name: &str) -> Option<String> {
    let object = Object::parse(text)?;
    let members = &object.members;
    if !members.iter().any(|m| m.name == name) {
        return None;
    }
    let first = members.first()?;
    let end = members.last()?.value.end;
    let mut out = String::with_capacity(text.len());
    out.push_str(text.get(..first.key_start)?);
    let mut written = false;
    for (i, m) in members.iter().enumerate() {
        if m.name == name {
            continue;
        }
        if written {
            // The separator that preceded this member, as received.
            out.push_str(text.get(members[i - 1].value.end..m.key_start)?);
        }
        out.push_str(text.get(m.key_start..m.value.end)?);
        written = true;
    }
    out.push_str(text.get(end..)?);
    Some(out)
}

/// The array text `array` with the JSON text `item` as its first item.
pub fn prepend_item(array: &str, item: &str) -> Option<String> {
    let empty = array_items(array)?.is_empty();
    let open = array.find('[')?;
    let with = if empty { item.to_owned() } else { format!("{item},") };
    splice(array, open + 1..open + 1, &with)
}

/// `text` with member `name` of the object at `object` (a range of `text`) rewritten by
/// `edit`, which gets that member's value text.
pub fn edit_member(
    text: &str,
    object: Range<usize>,
    name: &str,
    edit: impl FnOnce(&str) -> Option<String>,
) -> Option<String> {
    let inner = text.get(object.clone())?;
    let member = Object::parse(inner)?.get(name)?.value.clone();
    let new = edit(inner.get(member.clone())?)?;
    splice(text, object.start + member.start..object.start + member.end, &new)
}

/// True when `text` is one JSON object.
pub fn is_object(text: &str) -> bool {
    text.trim_start().starts_with('{') && serde_json::from_str::<&RawValue>(text).is_ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn members_know_where_they_lie() {
        let text = r#" { "a" : 1 ,"b\"c":[2, 3],
  "a":{"x":null} } "#;
        let o = Object::parse(text).unwrap();
        let names: Vec<_> = o.members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["a", "b\"c", "a"]);
        assert_eq!(o.value(text, "a"), Some(r#"{"x":null}"#));
        assert_eq!(&text[o.members[1].key_start..o.members[1].value.end], r#""b\"c":[2, 3]"#);
        assert!(Object::parse("[1]").is_none());
        assert!(Object::parse("{").is_none());
        assert!(Object::parse("").is_none());
    }

    #[test]
    fn set_replaces_or_adds() {
        assert_eq!(set_member(r#"{"a": 1, "b":2}"#, "a", "[]").unwrap(), r#"{"a": [], "b":2}"#);
        assert_eq!(set_member("{\"a\":1\n}", "c", "true").unwrap(), "{\"a\":1,\"c\":true\n}");
        assert_eq!(set_member("{ }", "c", "1").unwrap(), r#"{"c":1 }"#);
        assert!(set_member("[]", "c", "1").is_none());
    }

    #[test]
    fn remove_keeps_every_other_byte() {
        let cases = [
            (r#"{"a":1, "x":2 ,"b":3}"#, r#"{"a":1 ,"b":3}"#),
            (
                r#"{ "x":2,
 "b":3}"#,
                r#"{ "b":3}"#,
            ),
            (r#"{"a":1,"x":2}"#, r#"{"a":1}"#),
            (r#"{"x":1}"#, "{}"),
            (r#"{"x":1,"x":{"y":2},"a":[]}"#, r#"{"a":[]}"#),
            (r#"{"a":1,"x":1,"b":2,"x":3}"#, r#"{"a":1,"b":2}"#),
        ];
        for (text, want) in cases {
            assert_eq!(remove_members(text, "x").unwrap(), want, "{text}");
        }
        assert!(remove_members(r#"{"a":1}"#, "x").is_none());
        assert!(remove_members("nope", "x").is_none());
    }

    #[test]
    fn prepend_into_empty_and_full_arrays() {
        assert_eq!(prepend_item("[]", "1").unwrap(), "[1]");
        assert_eq!(prepend_item(" [ ]", "1").unwrap(), " [1 ]");
        assert_eq!(prepend_item("[ 2,3]", r#"{"a":1}"#).unwrap(), r#"[{"a":1}, 2,3]"#);
        assert!(prepend_item("{}", "1").is_none());
    }

    #[test]
    fn edit_a_nested_member() {
        let text = r#"{"usage":{"a":1},"b":2}"#;
        let out = edit_member(text, 9..16, "a", |v| Some(format!("[{v}]"))).unwrap();
        assert_eq!(out, r#"{"usage":{"a":[1]},"b":2}"#);
    }
}

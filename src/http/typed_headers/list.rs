//! What both RateLimit fields share: a list of policy-name strings with parameters, read
//! from every line of the field and written in one value. The typed headers hold their
//! items ([`Member`]s) in a `Vec`, and read, find and write them through the functions
//! here.

use std::borrow::Cow;

use bytes::BytesMut;
use http::HeaderValue;
use sfv::BareItem;

use super::error::InvalidField;
use super::format::{self, with_field_buffer};

/// An item of a RateLimit field: a policy name with its parameters.
pub(crate) trait Member: Sized {
    /// The field's name, as the debug event about a value that did not decode gives it.
    const FIELD: &'static str;

    /// The policy name.
    fn name(&self) -> &str;

    /// The member that a decoded item holds.
    fn read(item: &Item) -> Result<Self, InvalidField>;

    /// The member's parameters, written after its name.
    fn write_params(&self, out: &mut BytesMut);
}

/// The first of `members` named `name`.
pub(crate) fn find<'m, M: Member>(members: &'m [M], name: &str) -> Option<&'m M> {
    members.iter().find(|member| member.name() == name)
}

/// The members of one field value (every line joined with `, `), or what is wrong with it.
pub(crate) fn parse_with_reason<M: Member>(value: &[u8]) -> Result<Vec<M>, InvalidField> {
    items(value)?.iter().map(M::read).collect()
}

/// [`parse_with_reason`], the reason going to a debug-level event.
pub(crate) fn parse<M: Member>(value: &[u8]) -> Result<Vec<M>, headers::Error> {
    parse_with_reason(value).map_err(|error| error.into_header_error(M::FIELD))
}

/// The members of every line of the field, as `headers::Header::decode` reads them.
pub(crate) fn decode<'i, M: Member>(
    values: &mut impl Iterator<Item = &'i HeaderValue>,
) -> Result<Vec<M>, headers::Error> {
    parse(&joined(values)?)
}

/// `members` in one field value, as `headers::Header::encode` writes them: nothing for none.
pub(crate) fn encode<M: Member>(members: &[M], values: &mut impl Extend<HeaderValue>) {
    write(values, |buffer| {
        for member in members {
            format::push_separator(buffer);
            format::push_string(buffer, member.name());
            member.write_params(buffer);
        }
    });
}

/// `value`, a member's name or a string parameter, if a Structured Field string can hold
/// it (printable ASCII); an error otherwise.
pub(crate) fn checked_string(value: impl Into<String>) -> Result<String, headers::Error> {
    let value = value.into();
    if format::is_sf_string(&value) {
        Ok(value)
    } else {
        Err(headers::Error::invalid())
    }
}

/// One decoded item: the policy name and its parameters.
pub(crate) struct Item {
    pub(crate) name: String,
    params: sfv::Parameters,
}

impl Item {
    /// A non-negative integer parameter, if present.
    pub(crate) fn integer(&self, key: &str) -> Result<Option<u64>, InvalidField> {
        match self.params.get(key) {
            None => Ok(None),
            Some(BareItem::Integer(value)) => {
                u64::try_from(i64::from(*value)).map(Some).map_err(|_| {
                    InvalidField::shape(format!("`{key}` of {:?} is negative", self.name))
                })
            }
            Some(_) => Err(self.not_a(key, "an integer")),
        }
    }

    /// A required non-negative integer parameter.
    pub(crate) fn required_integer(&self, key: &str) -> Result<u64, InvalidField> {
        self.integer(key)?
            .ok_or_else(|| InvalidField::shape(format!("{:?} has no `{key}` parameter", self.name)))
    }

    /// A string parameter, if present.
    pub(crate) fn string(&self, key: &str) -> Result<Option<String>, InvalidField> {
        match self.params.get(key) {
            None => Ok(None),
            Some(BareItem::String(value)) => Ok(Some(value.as_str().to_owned())),
            Some(_) => Err(self.not_a(key, "a string")),
        }
    }

    /// A byte-sequence parameter, if present.
    pub(crate) fn bytes(&self, key: &str) -> Result<Option<Vec<u8>>, InvalidField> {
        match self.params.get(key) {
            None => Ok(None),
            Some(BareItem::ByteSequence(value)) => Ok(Some(value.clone())),
            Some(_) => Err(self.not_a(key, "a byte sequence")),
        }
    }

    fn not_a(&self, key: &str, kind: &str) -> InvalidField {
        InvalidField::shape(format!("`{key}` of {:?} is not {kind}", self.name))
    }
}

/// The items of a field value, read by sfv as a Structured Field list (RFC 9651, section
/// 4.2: a repeated parameter keeps its first place and its last value). Parameters the
/// draft does not define are ignored, as it asks; an inner list, or an item that is not a
/// string, is an error.
fn items(input: &[u8]) -> Result<Vec<Item>, InvalidField> {
    let list: sfv::List = sfv::Parser::new(input)
        .parse()
        .map_err(|error| InvalidField::syntax(&error))?;
    list.into_iter()
        .map(|member| match member {
            sfv::ListEntry::InnerList(_) => {
                Err(InvalidField::shape("an inner list where a policy belongs"))
            }
            sfv::ListEntry::Item(sfv::Item {
                bare_item: BareItem::String(name),
                params,
            }) => Ok(Item {
                name: name.into(),
                params,
            }),
            sfv::ListEntry::Item(_) => Err(InvalidField::shape(
                "a list item that is not a policy name string",
            )),
        })
        .collect()
}

/// Every line of a field as one value: lines join with `, `, as Structured Field lists
/// split over lines do. No line at all is an error (the field is absent).
fn joined<'i>(
    values: &mut impl Iterator<Item = &'i HeaderValue>,
) -> Result<Cow<'i, [u8]>, headers::Error> {
    let first = values.next().ok_or_else(headers::Error::invalid)?;
    let Some(second) = values.next() else {
        return Ok(Cow::Borrowed(first.as_bytes()));
    };
    let mut all = first.as_bytes().to_vec();
    for value in std::iter::once(second).chain(values) {
        all.extend_from_slice(b", ");
        all.extend_from_slice(value.as_bytes());
    }
    Ok(Cow::Owned(all))
}

/// A field value written by `write` into the layer's field buffer; nothing for an empty
/// list (a Structured Field list with no members is not sent).
fn write(values: &mut impl Extend<HeaderValue>, write: impl FnOnce(&mut BytesMut)) {
    let value = with_field_buffer(|buffer| {
        write(buffer);
        if buffer.is_empty() {
            return None;
        }
        HeaderValue::from_maybe_shared(buffer.split().freeze()).ok()
    });
    values.extend(value);
}

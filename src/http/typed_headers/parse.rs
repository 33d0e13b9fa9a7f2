//! A Structured Field list parser (RFC 9651, section 4.2), complete enough to tell every
//! valid list from every invalid one; the fields' own shape is checked by the types that
//! read its items.

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

use super::error::InvalidField;

/// A bare item. Only the kinds the RateLimit fields use keep their value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum BareItem {
    Integer(i64),
    String(String),
    Bytes(Vec<u8>),
    /// A decimal, token, boolean, date or display string.
    Other,
}

/// A list member: an item with its parameters, or an inner list (`None`).
pub(crate) type Member = Option<(BareItem, Vec<(String, BareItem)>)>;

/// RFC 9651 allows either padding form and non-zero pad bits; so does this decoder, as
/// general parsers do.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Parses `input` as a Structured Field list.
pub(crate) fn parse_list(input: &[u8]) -> Result<Vec<Member>, InvalidField> {
    let mut parser = Parser { input, index: 0 };
    parser.skip_sp();
    let mut members = Vec::new();
    while parser.peek().is_some() {
        members.push(parser.member()?);
        parser.skip_ows();
        match parser.next() {
            None => break,
            Some(b',') => {}
            Some(_) => return Err(parser.error("expected `,` after a list member")),
        }
        parser.skip_ows();
        if parser.peek().is_none() {
            return Err(parser.error("a trailing `,`"));
        }
    }
    Ok(members)
}

struct Parser<'a> {
    input: &'a [u8],
    index: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.index).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.index += 1;
        Some(byte)
    }

    fn skip_sp(&mut self) {
        while self.peek() == Some(b' ') {
            self.index += 1;
        }
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.index += 1;
        }
    }

    fn error(&self, what: &'static str) -> InvalidField {
        InvalidField::syntax(what, self.index)
    }

    fn member(&mut self) -> Result<Member, InvalidField> {
        if self.peek() == Some(b'(') {
            self.inner_list()?;
            return Ok(None);
        }
        let item = self.bare_item()?;
        let params = self.parameters()?;
        Ok(Some((item, params)))
    }

    fn inner_list(&mut self) -> Result<(), InvalidField> {
        self.index += 1;
        loop {
            self.skip_sp();
            match self.peek() {
                None => return Err(self.error("an unterminated inner list")),
                Some(b')') => {
                    self.index += 1;
                    self.parameters()?;
                    return Ok(());
                }
                Some(_) => {
                    self.bare_item()?;
                    self.parameters()?;
                    if !matches!(self.peek(), None | Some(b' ' | b')')) {
                        return Err(self.error("expected ` ` or `)` in an inner list"));
                    }
                }
            }
        }
    }

    fn parameters(&mut self) -> Result<Vec<(String, BareItem)>, InvalidField> {
        let mut params: Vec<(String, BareItem)> = Vec::new();
        while self.peek() == Some(b';') {
            self.index += 1;
            self.skip_sp();
            let key = self.key()?;
            let value = if self.peek() == Some(b'=') {
                self.index += 1;
                self.bare_item()?
            } else {
                BareItem::Other
            };
            // A repeated key keeps its first place and its last value.
            match params.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = value,
                None => params.push((key, value)),
            }
        }
        Ok(params)
    }

    fn key(&mut self) -> Result<String, InvalidField> {
        let start = self.index;
        match self.peek() {
            Some(b'a'..=b'z' | b'*') => self.index += 1,
            _ => return Err(self.error("expected a parameter key")),
        }
        while let Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*') = self.peek() {
            self.index += 1;
        }
        Ok(String::from_utf8_lossy(&self.input[start..self.index]).into_owned())
    }

    fn bare_item(&mut self) -> Result<BareItem, InvalidField> {
        match self.peek() {
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'"') => self.string(),
            Some(b':') => self.bytes(),
            Some(b'?') => {
                self.index += 1;
                match self.next() {
                    Some(b'0' | b'1') => Ok(BareItem::Other),
                    _ => Err(self.error("expected `0` or `1` after `?`")),
                }
            }
            Some(b'@') => {
                self.index += 1;
                match self.number()? {
                    BareItem::Integer(_) => Ok(BareItem::Other),
                    _ => Err(self.error("a date that is not an integer")),
                }
            }
            Some(b'%') => self.display_string(),
            Some(byte) if byte.is_ascii_alphabetic() || byte == b'*' => {
                self.index += 1;
                while let Some(byte) = self.peek() {
                    if !(is_tchar(byte) || byte == b':' || byte == b'/') {
                        break;
                    }
                    self.index += 1;
                }
                Ok(BareItem::Other)
            }
            _ => Err(self.error("expected an item")),
        }
    }

    fn number(&mut self) -> Result<BareItem, InvalidField> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.index += 1;
        }
        let mut magnitude: i64 = 0;
        let mut digits = 0;
        while let Some(byte @ b'0'..=b'9') = self.peek() {
            digits += 1;
            if digits > 15 {
                return Err(self.error("an integer of more than 15 digits"));
            }
            magnitude = magnitude * 10 + i64::from(byte - b'0');
            self.index += 1;
        }
        if digits == 0 {
            return Err(self.error("expected a digit"));
        }
        if self.peek() != Some(b'.') {
            return Ok(BareItem::Integer(if negative {
                -magnitude
            } else {
                magnitude
            }));
        }
        if digits > 12 {
            return Err(self.error("a decimal of more than 12 integer digits"));
        }
        self.index += 1;
        let mut fraction = 0;
        while let Some(b'0'..=b'9') = self.peek() {
            fraction += 1;
            if fraction > 3 {
                return Err(self.error("a decimal of more than 3 fraction digits"));
            }
            self.index += 1;
        }
        if fraction == 0 {
            return Err(self.error("a trailing decimal point"));
        }
        Ok(BareItem::Other)
    }

    fn string(&mut self) -> Result<BareItem, InvalidField> {
        self.index += 1;
        let mut value = Vec::new();
        loop {
            match self.next() {
                None => return Err(self.error("an unterminated string")),
                Some(b'\\') => match self.next() {
                    Some(byte @ (b'"' | b'\\')) => value.push(byte),
                    _ => return Err(self.error("a bad escape in a string")),
                },
                Some(b'"') => break,
                Some(byte @ 0x20..=0x7e) => value.push(byte),
                Some(_) => return Err(self.error("a string with a byte that is not printable")),
            }
        }
        // Printable ASCII only.
        Ok(BareItem::String(
            String::from_utf8_lossy(&value).into_owned(),
        ))
    }

    fn bytes(&mut self) -> Result<BareItem, InvalidField> {
        self.index += 1;
        let start = self.index;
        let Some(len) = self.input[start..].iter().position(|byte| *byte == b':') else {
            return Err(self.error("an unterminated byte sequence"));
        };
        self.index = start + len + 1;
        BASE64
            .decode(&self.input[start..start + len])
            .map(BareItem::Bytes)
            .map_err(|_| InvalidField::syntax("a byte sequence that is not base64", start))
    }

    fn display_string(&mut self) -> Result<BareItem, InvalidField> {
        self.index += 1;
        if self.next() != Some(b'"') {
            return Err(self.error("expected `\"` after `%`"));
        }
        let mut value = Vec::new();
        loop {
            match self.next() {
                None => return Err(self.error("an unterminated display string")),
                Some(b'"') => {
                    return match std::str::from_utf8(&value) {
                        Ok(_) => Ok(BareItem::Other),
                        Err(_) => Err(self.error("a display string that is not UTF-8")),
                    };
                }
                Some(b'%') => {
                    let mut octet = 0u8;
                    for _ in 0..2 {
                        let digit = match self.next() {
                            Some(byte @ b'0'..=b'9') => byte - b'0',
                            Some(byte @ b'a'..=b'f') => byte - b'a' + 10,
                            _ => return Err(self.error("a bad escape in a display string")),
                        };
                        octet = (octet << 4) | digit;
                    }
                    value.push(octet);
                }
                Some(byte @ 0x20..=0x7e) => value.push(byte),
                Some(_) => {
                    return Err(self.error("a display string with a byte that is not printable"));
                }
            }
        }
    }
}

/// RFC 9110's token characters.
fn is_tchar(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

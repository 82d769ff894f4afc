//! The one way a crate of flow declares a table of stable codes (the
//! compiler's diagnostics, `flowc diff`'s incompatibilities), so that
//! looking a code up, printing it and documenting it work alike for all.

/// Declares `enum Code` from a table whose rows are documented by their doc
/// comments, with `Code::ALL`, `Code::info` (the row given to
/// `$info::from_table(explanation, ..)`, the explanation being the doc
/// comment), `Code::as_str`, `Code::parse` (by code, case-insensitive, or
/// by name) and `Serialize` as the code's text. `$info` must have the
/// fields `code` and `name`.
#[macro_export]
macro_rules! code_table {
    (
        $(#[$meta:meta])*
        info = $info:ident;
        $(
            $(#[doc = $doc:literal])*
            $variant:ident = ($($row:expr),+ $(,)?);
        )*
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code { $($variant,)* }

        impl Code {
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            pub fn info(self) -> $info {
                match self {
                    $(Code::$variant => $info::from_table(concat!($($doc, "\n",)*), $($row),+),)*
                }
            }

            pub fn as_str(self) -> &'static str {
                self.info().code
            }

            /// Looks a code up by its code (`E101`, case-insensitive) or
            /// its name (`unknown-step`).
            pub fn parse(text: &str) -> Option<Code> {
                Code::ALL.iter().copied().find(|code| {
                    let info = code.info();
                    info.code.eq_ignore_ascii_case(text) || info.name == text
                })
            }
        }

        impl $crate::__serde::Serialize for Code {
            fn serialize<S: $crate::__serde::Serializer>(
                &self,
                serializer: S,
            ) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }
    };
}

//! Closed sets of named values — a kernel, a q(u) form, a likelihood, a stage, a run's
//! status — each declared once, by [`choice_enum!`], as a table of (value, name, help).
//! Everything else derives from that table: `name()`, `Display`, `FromStr` (one message
//! for an unknown name), serde (the name as a JSON string), the command line's possible
//! values with their help, and the lists that error messages print. A new value is one
//! table row; nothing else spells its name.

/// One value of a choice, as its table lists it.
#[derive(Debug)]
pub struct Entry<T: 'static> {
    pub value: T,
    /// What the command line, specs, configurations and the catalog call it.
    pub name: &'static str,
    /// One line for `--help` (empty where the value needs none).
    pub help: &'static str,
}

/// A closed set of named values (implemented by [`choice_enum!`]).
pub trait Choice: Copy + Eq + Sized + 'static {
    /// What one value is called in messages: "kernel", "stage".
    const WHAT: &'static str;
    /// Every value, in the order lists show them.
    const TABLE: &'static [Entry<Self>];

    /// The value's name (an exhaustive match, generated from the table).
    fn name(self) -> &'static str;

    /// The value named `text`, or a message listing the names.
    fn parse_name(text: &str) -> Result<Self, String> {
        Self::TABLE
            .iter()
            .find(|e| e.name == text)
            .map(|e| e.value)
            .ok_or_else(|| {
                format!(
                    "unknown {} '{text}' (expected one of: {})",
                    Self::WHAT,
                    Self::TABLE
                        .iter()
                        .map(|e| e.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }

    /// The names of the values `keep` selects, as a sentence lists them: "a, b or c".
    fn listed(keep: impl Fn(Self) -> bool) -> String {
        let names: Vec<&str> = Self::TABLE
            .iter()
            .filter(|e| keep(e.value))
            .map(|e| e.name)
            .collect();
        match names.split_last() {
            None => String::new(),
            Some((last, [])) => (*last).to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        }
    }
}

/// Declares a [`Choice`] enum from one table:
///
/// ```ignore
/// choice_enum! {
///     /// The GP kernel.
///     #[derive(Default)]
///     pub enum KernelChoice("kernel") {
///         #[default]
///         Linear = "linear" => "k(x, x') = σ² xᵀx'",
///         Se = "se" => "the squared exponential",
///     }
/// }
/// ```
///
/// The enum gets `Debug, Clone, Copy, PartialEq, Eq, Hash` (add others with `#[derive]`),
/// the inherent `NAMES`, `ALL` and `name()`, `Display` (padded, so `{:<10}` aligns),
/// `FromStr`, and serde as its name. The help after `=>` may be left out.
macro_rules! choice_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident ($what:literal) {
            $($(#[$vmeta:meta])* $variant:ident = $text:literal $(=> $help:literal)?),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $crate::choice::Choice for $name {
            const WHAT: &'static str = $what;
            const TABLE: &'static [$crate::choice::Entry<Self>] = &[$(
                $crate::choice::Entry {
                    value: $name::$variant,
                    name: $text,
                    help: concat!("" $(, $help)?),
                }
            ),+];

            fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        #[allow(dead_code)]
        impl $name {
            /// Every value's name, in the table's order.
            pub const NAMES: &'static [&'static str] = &[$($text),+];
            /// Every value, in the table's order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// What the command line, configurations and the catalog call this value.
            pub fn name(self) -> &'static str {
                <Self as $crate::choice::Choice>::name(self)
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.pad(self.name())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = String;

            fn from_str(text: &str) -> Result<Self, String> {
                <Self as $crate::choice::Choice>::parse_name(text)
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <String as ::serde::Deserialize>::deserialize(d)?;
                text.parse().map_err(<D::Error as ::serde::de::Error>::custom)
            }
        }
    };
}

pub(crate) use choice_enum;

#[cfg(test)]
mod tests {
    use super::Choice;

    choice_enum! {
        /// A test choice.
        #[derive(Default, PartialOrd, Ord)]
        enum Colour("colour") {
            #[default]
            Red = "red" => "the first",
            Light = "light-blue",
            Plus = "a+b" => "a name with a plus",
        }
    }

    #[test]
    fn names_parse_print_and_serialise_from_the_one_table() {
        for &c in Colour::ALL {
            assert_eq!(c.name().parse::<Colour>(), Ok(c));
            assert_eq!(c.to_string(), c.name());
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.name()));
            assert_eq!(serde_json::from_str::<Colour>(&json).unwrap(), c);
        }
        assert_eq!(Colour::NAMES, ["red", "light-blue", "a+b"]);
        assert_eq!(Colour::TABLE[0].help, "the first");
        assert_eq!(Colour::TABLE[1].help, "");
        assert_eq!(format!("[{:>6}]", Colour::Red), "[   red]");
        assert_eq!(Colour::default(), Colour::Red);
        let e = "blue".parse::<Colour>().unwrap_err();
        assert_eq!(
            e,
            "unknown colour 'blue' (expected one of: red, light-blue, a+b)"
        );
        assert!(serde_json::from_str::<Colour>("\"blue\"").is_err());
    }

    #[test]
    fn lists_read_as_sentences() {
        assert_eq!(Colour::listed(|_| true), "red, light-blue or a+b");
        assert_eq!(Colour::listed(|c| c != Colour::Red), "light-blue or a+b");
        assert_eq!(Colour::listed(|c| c == Colour::Plus), "a+b");
        assert_eq!(Colour::listed(|_| false), "");
    }
}

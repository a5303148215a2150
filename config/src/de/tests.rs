//! The deserializer's tests: lenient scalars, located errors, embedded
//! settings blocks.

use super::*;
use serde::Deserialize;

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Inner {
    port: u16,
    #[serde(default)]
    on: bool,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
enum Mode {
    Block,
    DropNewest,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Outer {
    name: String,
    inner: Inner,
    list: Vec<Located<String>>,
    mode: Mode,
    #[serde(default)]
    opt: Option<u32>,
}

fn parse<T: DeserializeOwned>(y: &str) -> Result<T, Error> {
    from_node(&Node::parse(y).unwrap(), "root")
}

#[test]
fn reads_typed_values_leniently() {
    let o: Outer = parse(
        "name: 42\ninner:\n  port: \"8080\"\n  on: 'true'\nlist: [a, b]\nmode: drop_newest\n",
    )
    .unwrap();
    assert_eq!(o.name, "42");
    assert_eq!(
        o.inner,
        Inner {
            port: 8080,
            on: true
        }
    );
    assert_eq!(o.list[1].value, "b");
    assert_eq!(o.list[1].line, 5);
    assert_eq!(o.list[1].path, "root.list.1");
    assert_eq!(o.mode, Mode::DropNewest);
    assert_eq!(o.opt, None);
}

#[test]
fn unknown_field_error_has_path_and_line() {
    let e = parse::<Outer>("name: x\ninner:\n  port: 1\n  prot: 2\nlist: []\nmode: block\n")
        .unwrap_err();
    assert_eq!(e.line, 4, "{e}");
    assert_eq!(e.path, "root.inner.prot");
    assert!(e.message.contains("unknown field `prot`"), "{e}");
}

#[test]
fn type_error_has_path_and_line() {
    let e = parse::<Outer>("name: x\ninner:\n  port: 70000\nlist: []\nmode: block\n").unwrap_err();
    assert_eq!((e.path.as_str(), e.line), ("root.inner.port", 3), "{e}");
    assert!(e.message.contains("0 to 65535"), "{e}");
    let e = parse::<Outer>("name: x\ninner:\n  port: 1\nlist: []\nmode: sideways\n").unwrap_err();
    assert_eq!((e.path.as_str(), e.line), ("root.mode", 5), "{e}");
    assert!(e.message.contains("sideways"), "{e}");
}

#[test]
fn missing_field_points_at_the_map() {
    let e = parse::<Outer>("name: x\ninner:\n  on: true\nlist: []\nmode: block\n").unwrap_err();
    assert_eq!(e.path, "root.inner", "{e}");
    assert!(e.message.contains("missing field `port`"), "{e}");
}

#[derive(Debug, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
struct Block {
    port: u16,
    on: bool,
    limits: Option<Inner>,
}

#[derive(Debug, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
struct Middle {
    #[serde(rename = "__proflow_embedded", default)]
    block: Block,
    size: u32,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Embedding {
    name: String,
    #[serde(rename = "__proflow_embedded", default)]
    middle: Middle,
}

#[test]
fn an_embedded_block_reads_the_keys_beside_its_struct() {
    let e: Embedding = parse("name: x\nport: '8080'\nsize: 3\non: true\n").unwrap();
    assert_eq!(e.name, "x");
    assert_eq!(e.middle.size, 3);
    assert_eq!(
        e.middle.block,
        Block {
            port: 8080,
            on: true,
            limits: None,
        }
    );
    // No key of the block: its defaults.
    let e: Embedding = parse("name: y\n").unwrap();
    assert_eq!(e.middle, Middle::default());
}

#[test]
fn an_embedded_block_refuses_unknown_keys_with_their_line_and_every_key() {
    let e = parse::<Embedding>("name: x\nport: 1\nprot: 2\n").unwrap_err();
    assert_eq!((e.path.as_str(), e.line), ("root.prot", 3), "{e}");
    for key in ["`port`", "`on`", "`size`", "`name`"] {
        assert!(e.message.contains(key), "{key} missing from {e}");
    }
    assert!(!e.message.contains(EMBEDDED), "{e}");
    let e = parse::<Embedding>("name: x\nport: 70000\n").unwrap_err();
    assert_eq!((e.path.as_str(), e.line), ("root.port", 2), "{e}");
    let e = parse::<Embedding>("port: 1\n").unwrap_err();
    assert!(e.message.contains("missing field `name`"), "{e}");
}

#[test]
fn an_unknown_key_below_an_embedded_block_names_only_its_own_map_keys() {
    let e = parse::<Embedding>("name: x\nlimits: {port: 1, bogus: 2}\n").unwrap_err();
    assert_eq!(e.path, "root.limits.bogus", "{e}");
    assert!(
        e.message.contains("`port`") && e.message.contains("`on`"),
        "{e}"
    );
    for key in ["`name`", "`size`", "`limits`"] {
        assert!(!e.message.contains(key), "{key} wrongly offered in {e}");
    }
    let e = parse::<Embedding>("name: x\nlimits: [1]\n").unwrap_err();
    assert_eq!(e.path, "root.limits", "{e}");
}

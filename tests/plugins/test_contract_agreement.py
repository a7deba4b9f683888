"""The plugins agree with the op contract (``dsa_export/ops/contract.py``), read from the sources:

* the C++ I/O tables (``struct DSA...Table`` in ``plugins/<plugin>/*.h``, see
  ``plugins/common/dsaPluginTable.h``), parsed with regular expressions; nothing is compiled;
* the PluginConfig YAML files (``plugins/*/*_PluginConfig.yaml``);
* the one list of plugins (``DSAPlugins`` in ``plugins/api/dsaCreators.h``).

Each must have the contract's input names in the contract's order, the same optional inputs, the
same outputs and the same attributes (names in order, types, required or default). Ops of the
contract without a plugin (``has_plugin=False``: the paged ops, which run through their ONNX
function body everywhere) have no table and no YAML; they are skipped explicitly.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dsa_export.ops.contract import OPS, PLUGIN_NAMESPACE, PLUGIN_OPS, PLUGIN_VERSION, OpSpec

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins"
CREATORS = PLUGINS / "api" / "dsaCreators.h"

#: Contract attribute kinds -> the C++ table's attr<Type>() -> the YAML's attribute_types.
KINDS = {"int": ("Int32", "int32"), "float": ("Float32", "float32"), "string": ("String", "char")}

_TABLE = re.compile(r"^struct\s+(?P<struct>\w+)\s*\n\{\n(?P<body>.*?)^\};", re.S | re.M)
_NAME = re.compile(r'\bkNAME\s*=\s*"(\w+)"\s*;')
_TENSOR = re.compile(r'\b(input|optionalInput|output)\(\s*"(\w+)"\s*\)')
_ATTR = re.compile(r'\battr(Int32|Float32|String)\(\s*"(\w+)"\s*(?:,\s*([^()]*?)\s*)?\)')


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _array(body: str, key: str) -> str | None:
    m = re.search(rf"\b{key}\[\]\s*=\s*\{{(.*?)\}};", body, re.S)
    return None if m is None else m.group(1)


def _entries(text: str, pattern: re.Pattern, where: str) -> list[re.Match]:
    """Every entry of a table array; anything the pattern does not read is an error, so a table
    written in another form fails here instead of being half read."""
    leftover = pattern.sub("", text)
    assert re.fullmatch(r"[\s,]*", leftover), \
        f"{where}: entries not of the form the test reads: {leftover.strip()!r}"
    return list(pattern.finditer(text))


def _default(kind: str, text: str | None):
    if text is None:
        return None
    if kind == "String":
        return text.strip('"')
    if kind == "Float32":
        return float(text.rstrip("fF"))
    return int(text)


def parse_tables(text: str, where: str) -> dict[str, dict]:
    """``{op name: table}`` of the table structs in a C++ header's text."""
    tables = {}
    for m in _TABLE.finditer(_strip_comments(text)):
        body = m.group("body")
        name = _NAME.search(body)
        if name is None:
            continue
        here = f"{where}: {m.group('struct')}"
        inputs_text, outputs_text = _array(body, "kINPUTS"), _array(body, "kOUTPUTS")
        assert inputs_text is not None and outputs_text is not None, \
            f"{here}: no kINPUTS or kOUTPUTS"
        inputs = _entries(inputs_text, _TENSOR, here + " kINPUTS")
        outputs = _entries(outputs_text, _TENSOR, here + " kOUTPUTS")
        assert all(e.group(1) != "output" for e in inputs), f"{here}: output() in kINPUTS"
        assert all(e.group(1) == "output" for e in outputs), f"{here}: input() in kOUTPUTS"
        attrs_text = _array(body, "kATTRIBUTES")
        attrs = [] if attrs_text is None else _entries(attrs_text, _ATTR, f"{here} kATTRIBUTES")
        assert name.group(1) not in tables, f"{where}: two tables of {name.group(1)}"
        tables[name.group(1)] = {
            "where": here,
            "inputs": [e.group(2) for e in inputs],
            "optional": [e.group(2) for e in inputs if e.group(1) == "optionalInput"],
            "outputs": [e.group(2) for e in outputs],
            "attributes": [(a.group(2), a.group(1), _default(a.group(1), a.group(3)))
                           for a in attrs],
        }
    return tables


def cpp_tables() -> dict[str, dict]:
    tables: dict[str, dict] = {}
    for header in sorted(PLUGINS.glob("dsa*Plugin/*.h")):
        where = header.relative_to(REPO).as_posix()
        for name, table in parse_tables(header.read_text(), where).items():
            assert name not in tables, \
                f"{name} has tables in {tables[name]['where']} and {table['where']}"
            tables[name] = table
    return tables


def yaml_configs() -> dict[str, dict]:
    """``{op name: {"where": file, "doc": document}}`` of the PluginConfig YAML files (one
    document per op)."""
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the PluginConfig files")
    configs: dict[str, dict] = {}
    for path in sorted(PLUGINS.glob("*/*_PluginConfig.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                where = path.relative_to(REPO).as_posix()
                assert doc["name"] not in configs, f"{doc['name']} is described twice ({where})"
                configs[doc["name"]] = {"where": where, "doc": doc}
    return configs


def cpp_problems(spec: OpSpec, table: dict) -> list[str]:
    """How a C++ table differs from the contract's op (empty: it agrees)."""
    problems = []
    want_inputs = [t.name for t in spec.inputs]
    if table["inputs"] != want_inputs:
        problems.append(f"inputs {table['inputs']} != contract {want_inputs}")
    want_optional = [t.name for t in spec.inputs if t.optional]
    if table["optional"] != want_optional:
        problems.append(f"optional inputs {table['optional']} != contract {want_optional}")
    want_outputs = [t.name for t in spec.outputs]
    if table["outputs"] != want_outputs:
        problems.append(f"outputs {table['outputs']} != contract {want_outputs}")
    want_attrs = [(a.name, KINDS[a.kind][0], a.default) for a in spec.attributes]
    if table["attributes"] != want_attrs:
        problems.append(f"attributes (name, type, default or None = required) "
                        f"{table['attributes']} != contract {want_attrs}")
    return problems


def yaml_problems(spec: OpSpec, doc: dict) -> list[str]:
    """How a PluginConfig document differs from the contract's op (empty: it agrees)."""
    problems = []
    if doc.get("namespace") != PLUGIN_NAMESPACE or str(doc.get("version")) != PLUGIN_VERSION:
        problems.append(f"namespace/version {doc.get('namespace')!r}/{doc.get('version')!r} != "
                        f"{PLUGIN_NAMESPACE!r}/{PLUGIN_VERSION!r}")
    version = (doc.get("versions") or {}).get(PLUGIN_VERSION)
    if version is None:
        return [*problems, f"no versions: {PLUGIN_VERSION!r} section"]
    inputs = list(version.get("inputs") or [])
    want_inputs = [t.name for t in spec.inputs]
    if inputs != want_inputs:
        problems.append(f"inputs {inputs} != contract {want_inputs}")
    optional = list(version.get("optional_inputs") or [])
    want_optional = [t.name for t in spec.inputs if t.optional]
    if optional != want_optional:
        problems.append(f"optional_inputs {optional} != contract {want_optional}")
    outputs = list(version.get("outputs") or [])
    want_outputs = [t.name for t in spec.outputs]
    if outputs != want_outputs:
        problems.append(f"outputs {outputs} != contract {want_outputs}")
    attributes = list(version.get("attributes") or [])
    want_attrs = [a.name for a in spec.attributes]
    if attributes != want_attrs:
        problems.append(f"attributes {attributes} != contract {want_attrs}")
    types = dict(version.get("attribute_types") or {})
    want_types = {a.name: KINDS[a.kind][1] for a in spec.attributes}
    if types != want_types:
        problems.append(f"attribute_types {types} != contract {want_types}")
    required = sorted(version.get("attributes_required") or [])
    want_required = sorted(a.name for a in spec.attributes if a.default is None)
    if required != want_required:
        problems.append(f"attributes_required {required} != contract {want_required}")
    defaults = dict(version.get("attribute_defaults") or {})
    want_defaults = {a.name: a.default for a in spec.attributes if a.default is not None}
    if defaults != want_defaults:
        problems.append(f"attribute_defaults {defaults} != contract {want_defaults}")
    return problems


def _plugin_spec(name: str) -> OpSpec:
    spec = OPS[name]
    if not spec.has_plugin:
        pytest.skip(f"{name} has no plugin (has_plugin=False in the contract: it runs through its "
                    "ONNX function body, TensorRT included), so there is no C++ table or "
                    "PluginConfig YAML to compare")
    return spec


def test_every_plugin_op_has_one_cpp_table_and_every_table_an_op():
    assert PLUGIN_OPS, "the contract lists no plugin ops"
    assert sorted(cpp_tables()) == sorted(PLUGIN_OPS)


def test_every_plugin_op_has_one_yaml_document_and_every_document_an_op():
    assert sorted(yaml_configs()) == sorted(PLUGIN_OPS)


def test_the_creator_list_holds_every_plugin_op_once():
    text = _strip_comments(CREATORS.read_text())
    m = re.search(r"using\s+DSAPlugins\s*=\s*PluginList<(.*?)>\s*;", text, re.S)
    assert m is not None, \
        f"{CREATORS.relative_to(REPO)} has no `using DSAPlugins = PluginList<...>;`"
    classes = [c.strip() for c in m.group(1).split(",")]
    # The plugin classes are named after their op: DSAIndexerTopK -> DSAIndexerTopKPlugin.
    assert all(c.endswith("Plugin") for c in classes), classes
    ops = [c[: -len("Plugin")] for c in classes]
    assert len(ops) == len(set(ops)), f"a plugin is listed twice: {classes}"
    assert sorted(ops) == sorted(PLUGIN_OPS)


@pytest.mark.parametrize("name", sorted(OPS))
def test_cpp_table_agrees_with_the_contract(name):
    spec = _plugin_spec(name)
    table = cpp_tables()[name]
    problems = cpp_problems(spec, table)
    assert not problems, \
        f"{table['where']} disagrees with the contract: " + "; ".join(problems)


@pytest.mark.parametrize("name", sorted(OPS))
def test_yaml_agrees_with_the_contract(name):
    spec = _plugin_spec(name)
    config = yaml_configs()[name]
    problems = yaml_problems(spec, config["doc"])
    assert not problems, \
        f"{config['where']} ({name}) disagrees with the contract: " + "; ".join(problems)


def table_text(spec: OpSpec) -> str:
    """A C++ table of ``spec`` written as the plugin headers write theirs."""
    def attr(a):
        kind = KINDS[a.kind][0]
        if a.default is None:
            return f'attr{kind}("{a.name}")'
        value = {"string": f'"{a.default}"', "float": f"{a.default}F"}.get(a.kind, a.default)
        return f'attr{kind}("{a.name}", {value})'

    inputs = "".join(f'        {"optionalInput" if t.optional else "input"}("{t.name}"),\n'
                     for t in spec.inputs)
    outputs = "".join(f'        output("{t.name}"),\n' for t in spec.outputs)
    attrs = "".join(f"        {attr(a)},\n" for a in spec.attributes)
    return (f"struct {spec.name}Table\n{{\n"
            f"    static constexpr char const* kNAME = \"{spec.name}\";\n"
            f"    static constexpr TensorSpec kINPUTS[] = {{\n{inputs}    }};\n"
            f"    static constexpr TensorSpec kOUTPUTS[] = {{\n{outputs}    }};\n"
            f"    static constexpr AttrSpec kATTRIBUTES[] = {{\n{attrs}    }};\n}};\n")


def test_a_reordered_or_renamed_table_entry_is_caught():
    """The comparison sees order, optional-ness, names and defaults, not just sets: swapping two
    inputs of a table, making an input required, renaming an attribute or changing a default fails
    it, and an entry the regular expressions cannot read is an error."""
    spec = OPS["DSAIndexerTopK"]
    text = table_text(spec)

    def problems(source: str) -> list[str]:
        return cpp_problems(spec, parse_tables(source, "test")[spec.name])

    assert problems(text) == []
    q, k = 'input("q"),', 'input("k"),'
    swapped = text.replace(q, "@").replace(k, q).replace("@", k)
    assert any(p.startswith("inputs") for p in problems(swapped))
    required = text.replace('optionalInput("lengths")', 'input("lengths")')
    assert any(p.startswith("optional") for p in problems(required))
    renamed = text.replace('"causal"', '"is_causal"')
    assert any(p.startswith("attributes") for p in problems(renamed))
    default = text.replace('attrInt32("causal", 1)', 'attrInt32("causal", 0)')
    assert any(p.startswith("attributes") for p in problems(default))
    with pytest.raises(AssertionError, match="not of the form"):
        parse_tables(text.replace('input("w"),', "input(kW),"), "test")


def test_a_reordered_yaml_input_is_caught():
    doc = dict(yaml_configs()["DSASparseAttention"]["doc"])
    version = dict(doc["versions"][PLUGIN_VERSION])
    assert yaml_problems(OPS["DSASparseAttention"], doc) == []
    version["inputs"] = ["q", "v", "k", "indices"]
    doc["versions"] = {PLUGIN_VERSION: version}
    assert any(p.startswith("inputs") for p in yaml_problems(OPS["DSASparseAttention"], doc))

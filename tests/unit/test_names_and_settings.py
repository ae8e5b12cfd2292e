import pytest

from tests.narrow import known
from vqueues.errors import BadRequest
from vqueues.names import fitted_name, validate_name
from vqueues.settings import Settings


@pytest.mark.parametrize("name", ["a", "a::b", "tenant/42", "ünïcødé", "😀", "x" * 249])
def test_names_of_1_to_249_utf8_bytes_are_accepted(name):
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 250, "é" * 125, "a\nb", "tab\there", "nul\x00"])
def test_empty_long_or_control_character_names_are_rejected(name):
    with pytest.raises(BadRequest) as err:
        validate_name(name)
    assert err.value.code == "invalid_name"


def test_flags_beat_environment_which_beats_defaults():
    s = Settings.load({"http_port": 9000}, env={"VQ_HTTP_PORT": "7000", "VQ_NODE_ID": "n1"})
    assert (s.http_port, s.node_id, s.data_topic) == (9000, "n1", "vq-data")


def test_bad_settings_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="HTTP_PORT"):
        Settings.load(env={"VQ_HTTP_PORT": "eighty"})
    with pytest.raises(ValueError, match="producer_acks"):
        Settings.load(env={"VQ_PRODUCER_ACKS": "2"})
    with pytest.raises(ValueError, match="not key=value"):
        Settings.load(env={"VQ_KAFKA_OPTIONS": "security.protocol"})
    for bad in ("-1", "2.5", "soon", "²"):
        with pytest.raises(ValueError, match="producer_busy_linger_ms"):
            Settings.load(env={"VQ_PRODUCER_BUSY_LINGER_MS": bad})


def test_the_busy_linger_is_2_ms_on_the_embedded_broker_and_5_on_kafka_unless_given():
    auto = Settings.load(env={})
    assert (auto.busy_linger_ms(embedded=True), auto.busy_linger_ms(embedded=False)) == (2, 5)
    given = Settings.load(env={"VQ_PRODUCER_BUSY_LINGER_MS": "10"})
    assert (given.busy_linger_ms(embedded=True), given.busy_linger_ms(embedded=False)) == (10, 10)
    off = Settings.load({"producer_busy_linger_ms": "0"}, env={})
    assert off.busy_linger_ms(embedded=False) == 0


def test_the_configuration_doc_lists_every_setting_as_generated():
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = known(importlib.util.spec_from_file_location("gen", root / "scripts/gen_config_doc.py"))
    gen = importlib.util.module_from_spec(spec)
    known(spec.loader).exec_module(gen)
    assert (root / "docs/configuration.md").read_text() == gen.render(), \
        "docs/configuration.md is stale: run scripts/gen_config_doc.py"


def test_the_allocator_can_be_told_to_keep_fewer_arenas_and_give_memory_back():
    from vqueues import memory

    assert memory.limit_arenas(0) is False  # 0 leaves glibc's default alone
    if memory._glibc() is None:
        pytest.skip("not glibc: the allocator calls are no-ops here")
    assert memory.limit_arenas(4) is True
    assert isinstance(memory.release_free_memory(), bool)


@pytest.mark.parametrize("argv", [["dev", "--nodes", "0"], ["dev", "--partitions", "-1"],
                                  ["topics", "create", "--partitions", "0"],
                                  ["dev", "--nodes", "two"]])
def test_a_cluster_of_no_nodes_or_no_partitions_is_refused_at_the_command_line(argv, capsys):
    from vqueues.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert argv[-2] in err and ("must be 1 or more" in err or "not a whole number" in err)


def test_one_node_and_one_partition_are_enough():
    from vqueues.cli import build_parser

    args = build_parser().parse_args(["dev", "--nodes", "1", "--partitions", "1"])
    assert (args.nodes, args.partitions) == (1, 1)


def test_a_name_over_the_limit_is_fitted_to_a_valid_name_that_names_it_alone():
    assert fitted_name("q" * 249) == "q" * 249  # at the limit: unchanged
    long = "dead-" + "é" * 124 + "x"  # 254 bytes; a two-byte character straddles the cut
    fitted = fitted_name(long)
    assert validate_name(fitted) == fitted and len(fitted.encode()) <= 249
    assert fitted.startswith("dead-" + "é" * 113) and fitted[-17] == "~"
    assert len(fitted.encode()) == 248  # the cut character is dropped, not split
    assert fitted_name(long) == fitted  # the same name each time
    assert fitted_name(long[:-1] + "y") != fitted  # another name, another hash
    assert len(fitted_name("d" * 400).encode()) == 249

"""The local Kafka cluster's pure parts: the pinned release, the brokers' settings, the jars'
cache, and what happens without Java or Maven (no process is started here)."""

import base64
import re

import pytest

from vqueues.kafka.local_cluster import (
    BROKER_CONFIG,
    KAFKA_VERSION,
    POM,
    LocalKafkaCluster,
    cluster_id,
)
from vqueues.kafka.maven import JarsUnavailable, cache_dir, fetch_jars, java
from vqueues.pipeline.jobs import SPARK_KAFKA_POM


def test_the_pom_pins_a_kafka_4_release_with_its_tools():
    assert re.fullmatch(r"4\.\d+\.\d+", KAFKA_VERSION)
    text = POM.read_text()
    for artifact in ("kafka_2.13", "kafka-tools"):
        assert f"<artifactId>{artifact}</artifactId>" in text


def test_every_topic_is_replicated_three_times_and_needs_two_in_sync():
    assert BROKER_CONFIG["default.replication.factor"] == "3"
    assert BROKER_CONFIG["min.insync.replicas"] == "2"
    for internal in ("offsets.topic", "transaction.state.log", "share.coordinator.state.topic"):
        assert BROKER_CONFIG[f"{internal}.replication.factor"] == "3"


def test_a_smaller_cluster_replicates_to_what_it_has(tmp_path):
    one = LocalKafkaCluster(1, folder=tmp_path)
    assert one.config["default.replication.factor"] == "1"
    assert one.config["min.insync.replicas"] == "1"
    two = LocalKafkaCluster(2, folder=tmp_path)
    assert (two.config["default.replication.factor"], two.config["min.insync.replicas"]) == (
        "2", "1")
    assert LocalKafkaCluster(3, folder=tmp_path).config == BROKER_CONFIG


def test_a_cluster_id_is_16_random_bytes_in_url_safe_base64():
    ids = {cluster_id() for _ in range(50)}
    assert len(ids) == 50
    for cid in ids:
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_the_jars_cache_is_per_pom_content(tmp_path, monkeypatch):
    monkeypatch.setenv("VQ_KAFKA_CACHE", str(tmp_path))
    a = tmp_path / "a.pom.xml"
    a.write_text("<project>1</project>")
    first = cache_dir(a)
    assert first.parent == tmp_path and first.name.startswith("a-")
    a.write_text("<project>2</project>")
    assert cache_dir(a) != first
    assert cache_dir(POM).name.startswith("local-kafka-")
    assert cache_dir(SPARK_KAFKA_POM).name.startswith("spark-kafka-")


def test_fetched_jars_are_not_fetched_again(tmp_path, monkeypatch):
    monkeypatch.setenv("VQ_KAFKA_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", "")  # no mvn: a second fetch must not need it
    libs = cache_dir(POM) / "libs"
    libs.mkdir(parents=True)
    (libs / ".fetched").touch()
    assert fetch_jars(POM) == libs


def test_without_maven_or_java_it_says_which(tmp_path, monkeypatch):
    monkeypatch.setenv("VQ_KAFKA_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(JarsUnavailable, match="needs Maven"):
        fetch_jars(POM)
    with pytest.raises(JarsUnavailable, match="needs Java 17"):
        java("the local Kafka cluster")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(JarsUnavailable, match="needs Java 17"):
        java("the local Kafka cluster")

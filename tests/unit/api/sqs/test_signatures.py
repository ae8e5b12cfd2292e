"""SigV4 verification against botocore's own signer, and the access key file."""

import datetime as dt
import json
import os

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from vqueues.api.auth import Identity
from vqueues.api.sqs.protocol import SqsError
from vqueues.api.sqs.signatures import AccessKey, AccessKeyFile, verify

pytestmark = pytest.mark.unit
KEYS = {"AKIDEXAMPLE": AccessKey("s3cret/key+", Identity("app", {"read": ("q",)}))}
BODY = b'{"QueueUrl": "http://h:1/000000000000/q"}'


def signed(secret="s3cret/key+", key_id="AKIDEXAMPLE", region="eu-west-1",
           url="http://127.0.0.1:8080/", body=BODY):
    """(headers by lower-case name, the time it was signed) as botocore signs a call."""
    request = AWSRequest("POST", url, data=body, headers={
        "Content-Type": "application/x-amz-json-1.0",
        "X-Amz-Target": "AmazonSQS.ReceiveMessage"})
    SigV4Auth(Credentials(key_id, secret), "sqs", region).add_auth(request)
    headers = {k.lower(): [v] for k, v in request.headers.items()}
    headers.setdefault("host", [url.split("/")[2]])
    at = dt.datetime.strptime(headers["x-amz-date"][0], "%Y%m%dT%H%M%SZ").replace(
        tzinfo=dt.UTC)
    return headers, at


def check(headers, at, body=BODY, path="/", keys=KEYS):
    return verify(keys, "POST", path, "", headers, body, at)


def test_a_call_botocore_signed_is_verified_in_any_region():
    headers, at = signed()
    assert check(headers, at).name == "app"
    headers, at = signed(url="http://127.0.0.1:8080/000000000000/q", region="us-east-1")
    assert check(headers, at, path="/000000000000/q").name == "app"


@pytest.mark.parametrize(("change", "name"), [
    (lambda h, at: (h, at, BODY + b" "), "SignatureDoesNotMatch"),  # the body changed
    (lambda h, at: ({**h, "host": ["other:8080"]}, at, BODY), "SignatureDoesNotMatch"),
    (lambda h, at: ({**h, "x-amz-target": ["AmazonSQS.DeleteQueue"]}, at, BODY),
     "SignatureDoesNotMatch"),
    (lambda h, at: (h, at + dt.timedelta(minutes=16), BODY), "SignatureDoesNotMatch"),
    (lambda h, at: ({k: v for k, v in h.items() if k != "authorization"}, at, BODY),
     "MissingAuthenticationToken"),
    (lambda h, at: ({**h, "authorization": ["Bearer x"]}, at, BODY), "IncompleteSignature"),
    (lambda h, at: ({k: v for k, v in h.items() if k != "x-amz-date"}, at, BODY),
     "IncompleteSignature"),
])
def test_a_changed_or_incomplete_call_is_refused(change, name):
    headers, at = signed()
    with pytest.raises(SqsError) as info:
        check(*change(headers, at))
    assert info.value.name == name


def test_a_wrong_secret_or_an_unknown_key_is_refused():
    with pytest.raises(SqsError) as info:
        check(*signed(secret="wrong"))
    assert info.value.name == "SignatureDoesNotMatch"
    with pytest.raises(SqsError) as info:
        check(*signed(key_id="AKIDOTHER"))
    assert info.value.name == "InvalidClientTokenId"


def test_the_key_file_is_read_only_when_its_owner_alone_may_read_it(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [{"id": "K1", "secret": "s1", "name": "one",
                                          "scopes": {"read": [""]}}]}))
    os.chmod(path, 0o644)
    keys = AccessKeyFile(str(path))
    assert keys.keys == {}  # readable by others: refused
    os.chmod(path, 0o600)
    os.utime(path, (1, 1))
    assert keys.reload() and keys.keys["K1"].identity.name == "one"
    path.write_text(json.dumps({"keys": [{"id": "K2", "secret": "s2"}]}))  # rotated
    os.utime(path, (2, 2))
    assert keys.reload() and list(keys.keys) == ["K2"]
    path.write_text("{broken")
    os.utime(path, (3, 3))
    assert not keys.reload() and list(keys.keys) == ["K2"]  # a bad file keeps the keys

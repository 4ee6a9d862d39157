import pickle

from protocol.errors import CLOSE_CODES, CLOSE_NORMAL, ErrorCode, ProtocolError, close_code


def test_every_code_has_a_valid_close_code():
    reserved = {1004, 1005, 1006, 1015}  # never sent on the wire (RFC 6455 §7.4.1)
    for code in ErrorCode:
        cc = close_code(code)
        assert cc in CLOSE_CODES.values()
        assert 1000 < cc < 1012 or 4000 <= cc <= 4999
        assert cc not in reserved
    assert CLOSE_NORMAL == 1000


def test_codes_are_stable_wire_values():
    # Third-party clients hard-code these (docs/protocol.md §7): never renumber.
    assert ErrorCode.MALFORMED == 1
    assert ErrorCode.BAD_FIELD == 3
    assert ErrorCode.CHECKSUM == 10
    assert ErrorCode.INTERNAL == 16
    assert close_code(ErrorCode.TOO_LARGE) == 1009
    assert close_code(ErrorCode.RATE_LIMITED) == 1008


def test_protocol_error_carries_code_message_and_pickles():
    exc = ProtocolError(ErrorCode.BAD_FIELD, "task.steps: expected int")
    assert exc.code is ErrorCode.BAD_FIELD
    assert exc.close_code == 4003
    assert "task.steps" in str(exc)
    back = pickle.loads(pickle.dumps(exc))
    assert (back.code, back.message) == (exc.code, exc.message)


def test_client_close_codes_are_4000_plus_the_code():
    """A browser may close only with 1000 or 3000-4999 (§7): a client's close for an
    error is 4000 + code, also where the server's own close is a 1xxx code."""
    from protocol.errors import client_close_code

    for code in ErrorCode:
        cc = client_close_code(code)
        assert 4000 <= cc <= 4999 and cc == 4000 + int(code)
        if close_code(code) >= 4000:
            assert cc == close_code(code)  # the same as the server's where it can be
    assert client_close_code(ErrorCode.MALFORMED) == 4001
    assert client_close_code(ErrorCode.INTERNAL) == 4016

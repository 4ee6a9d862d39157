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

from toolfleet.shared.urls import redacted_url


def test_password_in_userinfo_is_masked() -> None:
    """A password in the URL's user info never survives redaction."""
    assert redacted_url("redis://u:s3cret@h:6379/0") == "redis://u:***@h:6379/0"
    assert redacted_url("redis://:s3cret@h:6379/0") == "redis://:***@h:6379/0"
    assert "s3cret" not in redacted_url("rediss://default:s3cret@h/1?ssl_cert_reqs=none")


def test_password_query_parameter_is_masked() -> None:
    """unix:// URLs carry the password as a query parameter; it is masked too."""
    assert redacted_url("unix:///tmp/r.sock?db=0&password=s3cret") == (
        "unix:///tmp/r.sock?db=0&password=***"
    )


def test_urls_without_secrets_are_unchanged() -> None:
    """A URL without credentials reads the same after redaction."""
    assert redacted_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redacted_url(None) == ""

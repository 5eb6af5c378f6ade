"""A custom bearer-token verifier (the SDK's TokenVerifier protocol), loaded by the gateway
with ``--token-verifier mcp_verifier:verifier``: "acme-<anything>" is account acme."""

from __future__ import annotations

from mcp.server.auth.provider import AccessToken


class PrefixVerifier:
    """Accepts tokens "<account>-<anything>" for the accounts it knows."""

    accounts = ("acme",)

    async def verify_token(self, token: str) -> AccessToken | None:
        account, _, rest = token.partition("-")
        if account not in self.accounts or not rest:
            return None
        return AccessToken(token="", client_id=account, scopes=[], claims={"account": account})


verifier = PrefixVerifier()

"""Personal data and secrets the scrubber must catch, by kind (unit and live tests share them).

Every value is synthetic: documented test numbers (cards, IBANs), AWS's and GitHub's published
example shapes, keys made of filler characters.
"""

from __future__ import annotations

CORPUS: dict[str, tuple[str, ...]] = {
    "email": ("alice.smith+ml@example.com", "bob_oneil@mail.example.co.uk"),
    "phone": ("+14155552671", "+44 20 7946 0958", "(415) 555-2671", "030-1234-5678"),
    "card": ("4111 1111 1111 1111", "5555555555554444", "3782-822463-10005", "6011000990139424"),
    "iban": ("DE89 3704 0044 0532 0130 00", "GB82WEST12345698765432", "FR1420041010050500013M02606"),
    "jwt": (
        (
            "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
            "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
        ),
    ),
    "bearer_token": ("Bearer 9f8e7d6c5b4a3f2e1d0c",),
    "credential": ("client_secret=s3cr3tV4lue99", "password: Tr0ub4dor-and-3"),
    "openai_key": ("sk-proj-Ab12Cd34Ef56Gh78Ij90Kl12Mn34Op56",),
    "anthropic_key": ("sk-ant-api03-Zy98Xw76Vu54Ts32Rq10Po98",),
    "huggingface_token": ("hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",),
    "github_token": ("ghp_" + "A1b2C3d4E5" * 3 + "F6g7H8", "github_pat_11ABCDEFG0123456789_abcdefghijklmnop"),
    "aws_access_key": ("AKIAIOSFODNN7EXAMPLE",),
    "gcp_api_key": ("AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",),
    "azure_key": ("AccountKey=" + "Zm9vYmFy" * 11 + "==",),
    "private_key": (
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo\n"
            "4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0\n-----END RSA PRIVATE KEY-----"
        ),
    ),
}


def secret_part(kind: str, value: str) -> str:
    """What of ``value`` must not leave the node (a credential's field name and a bearer's scheme stay)."""
    if kind in ("bearer_token", "credential", "azure_key"):
        return value.split("=", 1)[-1].split(": ", 1)[-1].split(" ", 1)[-1]
    if kind == "private_key":
        return value.splitlines()[1]
    return value

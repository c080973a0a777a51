"""The run's own certificate authority for the etcd a membership job starts (toolkit.plan.rules.check_membership).

    write_run_certificates(DIR)   ca.crt, server.crt/.key (the job's etcd), client.crt/.key (the run's gateways,
                                  the job's membership.py, tk status): a directory only its owner can read

One authority per run, whose key is used once and never written: nobody, the run's owner included, can mint a
further certificate it accepts, so the etcd of this run opens to this run's certificate only. ECDSA P-256, valid
for as long as any job may run (MAX_DAYS). Certificates name no host: clients verify the chain (the run's CA signs
nothing else), not a host name, because the etcd's address is known only once the job has its nodes.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

MAX_DAYS = 400  # past Slurm's longest usual time limits; the CA's key is gone anyway
FILES = ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")


def write_run_certificates(directory: str | os.PathLike) -> Path:
    """Create `directory` (mode 0700, which must not exist yet) holding FILES (mode 0600); returns it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out = Path(directory)
    out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    out.mkdir(mode=0o700)
    os.chmod(out, 0o700)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=10), now + datetime.timedelta(days=MAX_DAYS)

    def name(cn: str):
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tk run"),
                          x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name(f"tk run CA {out.parent.parent.name}"[:64]))
          .issuer_name(name(f"tk run CA {out.parent.parent.name}"[:64])).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM

    def write(fname: str, data: bytes) -> None:
        fd = os.open(out / fname, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    write("ca.crt", ca.public_bytes(pem))
    # etcd's own JSON gateway dials etcd with the server certificate as a client one: it needs both usages
    for leaf, usages in (("server", [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                         ("client", [ExtendedKeyUsageOID.CLIENT_AUTH])):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(f"tk {leaf}")).issuer_name(ca.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(start).not_valid_after(end)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                .sign(ca_key, hashes.SHA256()))
        write(f"{leaf}.crt", cert.public_bytes(pem))
        write(f"{leaf}.key", key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return out

"""The run's own certificate authority for the etcd a membership job starts (toolkit.plan.rules.check_membership).

    write_run_certificates(DIR)   ca.crt, server.crt/.key (the job's etcd, its client port), peer.crt/.key (the
                                  job's etcd, its peer port), client.crt/.key (the run's gateways, the job's
                                  membership.py, tk status): a directory only its owner can read

One authority per run, whose key is used once and never written: nobody, the run's owner included, can mint a
further certificate it accepts, so the etcd of this run opens to this run's certificate only. ECDSA P-256, valid
for as long as any job may run (MAX_DAYS). The client and server certificates name no host: clients verify the
chain (the run's CA signs nothing else), not a host name, because the etcd's address is known only once the job
has its nodes. The peer certificate names 127.0.0.1 (PEER_HOST), where the job's single-member etcd binds its peer
port: etcd presents it both as the peer listener's server certificate and as the client certificate of a member
dialing a peer (so it carries both usages), and on a peer listener etcd refuses a client certificate whose IP SANs
do not match the connection's remote address (pkg/transport/listener.go `wrapTLS` -> listener_tls.go
`checkCertSAN`, etcd-io/etcd@322976be; `--experimental-peer-skip-client-san-verification` turns it off). That check
is why the peer has a certificate of its own: server.crt, which etcd's JSON gateway presents from the node's
address, names no host.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

MAX_DAYS = 400  # past Slurm's longest usual time limits; the CA's key is gone anyway
FILES = ("ca.crt", "server.crt", "server.key", "peer.crt", "peer.key", "client.crt", "client.key")
PEER_HOST = "127.0.0.1"  # the job's etcd peer listener (toolkit.render.job.ETCD_SH)


def write_run_certificates(directory: str | os.PathLike) -> Path:
    """Create `directory` (mode 0700, which must not exist yet) holding FILES (mode 0600); returns it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    import ipaddress

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
    both = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    # etcd's own JSON gateway dials etcd with the server certificate as a client one: it needs both usages; so does
    # the peer certificate (a member's peer server and its dialer), which names the one address peers use
    for leaf, usages, hosts in (("server", both, []), ("peer", both, [PEER_HOST]),
                                ("client", [ExtendedKeyUsageOID.CLIENT_AUTH], [])):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(name(f"tk {leaf}")).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(h)) for h in hosts]), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        write(f"{leaf}.crt", cert.public_bytes(pem))
        write(f"{leaf}.key", key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return out

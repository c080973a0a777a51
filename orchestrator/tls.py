"""The run's client certificate, for the etcd the job starts (standard library only).

That etcd opens only to a certificate of the run's own authority (etcd --client-cert-auth; tk writes the files into
RUN/secrets/etcd: ca.crt, client.crt, client.key). The job's own calls to it, its health probes (orchestrator.probe)
and the membership reads and deletes (orchestrator.membership), present that certificate over HTTPS and check the
etcd's against the run's CA, not against a host name (the run's CA signs nothing else).

    use_client_certificate(DIR)   from now on, https:// calls present DIR's certificate
    context()                     the SSL context for https:// calls (None: no certificate configured)
"""

from __future__ import annotations

import os
import ssl
from typing import Optional

FILES = ("ca.crt", "client.crt", "client.key")
_context: Optional[ssl.SSLContext] = None


class CertificateMissing(RuntimeError):
    pass


def use_client_certificate(tls_dir: str) -> None:
    global _context
    missing = [f for f in FILES if not os.access(os.path.join(tls_dir, f), os.R_OK)]
    if missing:
        raise CertificateMissing(f"no {', '.join(missing)} in {tls_dir}: tk launch writes the run's own "
                                 "(tk launch --dry-run prepares a run directory to submit by hand)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(os.path.join(tls_dir, "ca.crt"))
    ctx.check_hostname = False
    ctx.load_cert_chain(os.path.join(tls_dir, "client.crt"), os.path.join(tls_dir, "client.key"))
    _context = ctx


def context() -> Optional[ssl.SSLContext]:
    return _context


def scheme() -> str:
    """The scheme the job's etcd speaks: https once a certificate is configured."""
    return "https" if _context is not None else "http"

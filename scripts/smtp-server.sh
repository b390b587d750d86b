#!/usr/bin/env bash
# scripts/smtp-server.sh — the real SMTP server the notification tests send
# email to: aiosmtpd (PyPI, pinned), in a virtualenv cached outside the
# repository and keyed by its version and Python's.
#
#   scripts/smtp-server.sh python   install if missing; print the
#                                   interpreter that runs `-m aiosmtpd`
#
# The tests start it themselves (`python -m aiosmtpd -n -l 127.0.0.1:PORT
# -c aiosmtpd.handlers.Mailbox DIR`) and read what it received from the
# Maildir DIR.
#
# Environment:
#   MEATSPACE_TOOLS_CACHE  where tools are cached (default ~/.cache/meatspace-tools)
set -euo pipefail

AIOSMTPD=1.4.6
ATPUBLIC=9.0.0
ATTRS=26.1.0

die() { printf '[smtp-server] ERROR: %s\n' "$*" >&2; exit 1; }

[[ ${1:-} == python ]] || { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
command -v python3 >/dev/null || die "python3 is not installed"
CACHE=${MEATSPACE_TOOLS_CACHE:-$HOME/.cache/meatspace-tools}
PYV=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
VENV=$CACHE/aiosmtpd-$AIOSMTPD-py$PYV
if [[ ! -f $VENV/.complete ]]; then
  # Concurrent test binaries may both get here: one installs, under a lock.
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.aiosmtpd.lock"
  flock 9
  if [[ ! -f $VENV/.complete ]]; then
    printf '[smtp-server] installing aiosmtpd %s into %s\n' "$AIOSMTPD" "$VENV" >&2
    rm -rf "$VENV"
    python3 -m venv "$VENV" || die "python3 -m venv failed (is python3-venv installed?)"
    "$VENV/bin/pip" install --disable-pip-version-check --quiet \
      "aiosmtpd==$AIOSMTPD" "atpublic==$ATPUBLIC" "attrs==$ATTRS" \
      || die "pip install aiosmtpd failed"
    touch "$VENV/.complete"
  fi
fi
printf '%s\n' "$VENV/bin/python"

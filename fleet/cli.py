"""`fleet`: the operator's command for model updates across a fleet.

    fleet keygen KEYFILE
    fleet publish --store DIR --key KEYFILE --name N --version V [--admitted k=v ...] MODEL
    fleet verify --store DIR|URL --trust PUBKEY N:V
    fleet rollout start --store DIR|URL --key KEYFILE --group G --model N:V --canary A,B
    fleet rollout run ...   (canary, wait, soak, promote; halt and exit 1 on a rollback)
    fleet promote --group G --key KEYFILE
    fleet halt --group G --key KEYFILE
    fleet list

Exit status: 0 done, 1 refused (a signature, a hash, a halted rollout), 2 bad input or an
unreachable store or broker. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from configkit.secrets import SecretRef
from fleet.broker import BrokerError, BrokerLink, BrokerOptions
from fleet.controller import canary_verdict, group_progress
from fleet.download import Downloader, DownloadError
from fleet.manifest import ManifestError, ModelRef, utc_now_iso
from fleet.names import check_name, check_sha256
from fleet.rollout import (
    MAX_SOAK_S,
    Rollout,
    SignedRollout,
    Stage,
    rollout_topic,
    rollouts_filter,
    status_filter,
)
from fleet.signing import KeyLoadError, SignatureError, Signer, Verifier, generate_key, key_id
from fleet.status import (
    AgentStatus,
    availability_filter,
    fleet_rows,
    parse_status,
    render_table,
)
from fleet.store import DirectoryStore, StoreError

logger = logging.getLogger(__name__)

DEFAULT_PREFIX = "video-analytics"


class CliError(Exception):
    """A failure reported as one line; `code` is the exit status."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


# -- argument types ------------------------------------------------------------------------


def _name(value: str) -> str:
    try:
        return check_name(value, "name")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _name_version(value: str) -> tuple[str, str]:
    name, sep, version = value.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"{value!r}: expected NAME:VERSION")
    return _name(name), _name(version)


def _metric(value: str) -> tuple[str, float]:
    key, sep, number = value.partition("=")
    try:
        result = float(number)
    except ValueError:
        result = float("nan")
    if not sep or not key or result != result or result in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{value!r}: expected NAME=NUMBER, e.g. map50=0.71")
    return key, result


def _size(value: str) -> tuple[int, int]:
    height, sep, width = value.lower().partition("x")
    if not sep or not height.isdigit() or not width.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: expected HEIGHTxWIDTH, e.g. 320x320")
    return int(height), int(width)


def _sha(value: str) -> str:
    try:
        return check_sha256(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _agents(value: str) -> list[str]:
    agents = [a.strip() for a in value.split(",") if a.strip()]
    return [_name(a) for a in agents]


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0 <= seconds <= MAX_SOAK_S:
        raise argparse.ArgumentTypeError(f"{value}: expected 0..{MAX_SOAK_S:.0f} seconds")
    return seconds


def _wait_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0.1 <= seconds <= 60:
        raise argparse.ArgumentTypeError(f"{value}: expected 0.1..60 seconds")
    return seconds


# -- shared options ------------------------------------------------------------------------


def _add_key(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--key", type=Path, help="signing key (PEM file, mode 0600)")
    group.add_argument("--key-env", metavar="VAR", help="environment variable holding the PEM")
    group.add_argument(
        "--key-credential", metavar="NAME", help="systemd credential holding the PEM"
    )


def _signer(args: argparse.Namespace) -> Signer:
    if args.key is not None:
        return Signer.from_file(args.key)
    if args.key_env is not None:
        return Signer.from_secret(SecretRef(env=args.key_env))
    return Signer.from_secret(SecretRef(credential=args.key_credential))


def _add_store(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument(
        "--store", required=required, help="store directory or URL (https://, file://)"
    )
    parser.add_argument("--store-ca", type=Path, help="CA file for an https:// store")


def _add_trust(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="PUBKEY",
        help="trusted public key (base64; repeat for several)",
    )


def _add_broker(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--broker", default="127.0.0.1:1883", help="MQTT broker host:port")
    parser.add_argument("--broker-ca", type=Path, help="CA file: TLS to the broker")
    parser.add_argument("--username", help="broker user name")
    parser.add_argument(
        "--password-env", metavar="VAR", help="environment variable holding the password"
    )
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="the agents' mqtt.topic_prefix")
    parser.add_argument(
        "--wait-s",
        type=_wait_seconds,
        default=1.0,
        help="how long to wait for retained documents to arrive (0.1..60 seconds)",
    )


def _broker(args: argparse.Namespace) -> BrokerLink:
    try:
        host, port = BrokerOptions.parse_address(args.broker)
    except ValueError as error:
        raise CliError(str(error)) from None
    return BrokerLink(
        BrokerOptions(
            host=host,
            port=port,
            ca_path=args.broker_ca,
            username=args.username,
            password_env=args.password_env,
        )
    )


def _store_url(store: str) -> str:
    return store if "://" in store else Path(store).resolve().as_uri()


def _verifier(args: argparse.Namespace, signer: Signer | None = None) -> Verifier:
    trusted = list(args.trust)
    if signer is not None:
        trusted.append(signer.public_b64)
    if not trusted:
        raise CliError("give at least one --trust PUBKEY")
    return Verifier(trusted)


# -- commands ------------------------------------------------------------------------------


def cmd_keygen(args: argparse.Namespace) -> int:
    public = generate_key(args.keyfile)
    print(f"wrote {args.keyfile} (keep it secret; mode 0600)")
    print(f"public key: {public}")
    print(f"key id:     {key_id(public)}")
    return 0


def cmd_pubkey(args: argparse.Namespace) -> int:
    signer = _signer(args)
    print(signer.public_b64)
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    signed = DirectoryStore(args.store).publish(
        args.model,
        args.name,
        args.version,
        _signer(args),
        admitted=dict(args.admitted),
        derived_from=args.derived_from,
        classes=args.classes.split(",") if args.classes else None,
        input_size=args.input,
    )
    manifest = signed.manifest
    print(f"published {manifest.ref} ({manifest.bytes} bytes, {manifest.runtime})")
    print(f"sha256 {manifest.sha256}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    name, version = args.model
    verifier = _verifier(args)
    with tempfile.TemporaryDirectory(prefix="fleet-verify-") as cache:
        downloader = Downloader(_store_url(args.store), cache, ca_path=args.store_ca)
        signed = downloader.manifest(name, version)
        manifest = signed.verified(verifier)
        downloader.artifact(manifest)
    signer_id = verifier.verify(manifest.canonical_bytes(), signed.signatures)
    print(
        f"ok: {manifest.ref} signed by {signer_id}, artifact hash matches ({manifest.bytes} bytes)"
    )
    return 0


def _lookup(args: argparse.Namespace, signer: Signer) -> ModelRef:
    """The store's manifest of `--model`, verified: the rollout names its digest."""
    name, version = args.model
    with tempfile.TemporaryDirectory(prefix="fleet-") as cache:  # only the manifest is read
        downloader = Downloader(_store_url(args.store), cache, ca_path=args.store_ca)
        return downloader.manifest(name, version).verified(_verifier(args, signer)).ref


def _read_rollout(link: BrokerLink, args: argparse.Namespace) -> Rollout | None:
    topic = rollout_topic(args.prefix, args.group)
    payload = link.read_retained(topic, quiet_s=args.wait_s).get(topic)
    if payload is None:
        return None
    return SignedRollout.parse(payload).rollout


def _publish_rollout(link: BrokerLink, rollout: Rollout, signer: Signer, prefix: str) -> None:
    link.publish(
        rollout_topic(prefix, rollout.group),
        SignedRollout.sign(rollout, signer).to_bytes(),
        retain=True,
    )
    canary = f" (canary: {', '.join(rollout.canary)})" if rollout.stage == "canary" else ""
    print(f"group {rollout.group}: {rollout.model} stage {rollout.stage}{canary}")


def _new_rollout(args: argparse.Namespace, model: ModelRef) -> Rollout:
    stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
    return Rollout(
        rollout_id=f"r{stamp}-{model.sha256[:12]}",
        group=args.group,
        model=model,
        stage="canary" if args.canary else "all",
        canary=args.canary,
        issued_at=utc_now_iso(),
        soak_s=args.soak,
    )


def cmd_rollout_start(args: argparse.Namespace) -> int:
    signer = _signer(args)
    rollout = _new_rollout(args, _lookup(args, signer))
    with _broker(args) as link:
        _publish_rollout(link, rollout, signer, args.prefix)
    return 0


def _restage(args: argparse.Namespace, stage: Stage) -> int:
    signer = _signer(args)
    with _broker(args) as link:
        current = _read_rollout(link, args)
        if current is None:
            raise CliError(f"group {args.group} has no rollout to {stage}")
        if stage == "all" and current.stage == "halted":
            raise CliError(f"the rollout of {current.model} to {args.group} is halted: start anew")
        updated = current.model_copy(update={"stage": stage, "issued_at": utc_now_iso()})
        _publish_rollout(link, updated, signer, args.prefix)
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    return _restage(args, "all")


def cmd_halt(args: argparse.Namespace) -> int:
    return _restage(args, "halted")


def cmd_rollout_clear(args: argparse.Namespace) -> int:
    with _broker(args) as link:
        link.publish(rollout_topic(args.prefix, args.group), b"", retain=True)
    print(f"group {args.group}: rollout cleared (agents keep what they run)")
    return 0


def _statuses(link: BrokerLink, args: argparse.Namespace) -> dict[str, AgentStatus]:
    found = {}
    for topic, payload in link.read_retained(status_filter(args.prefix), args.wait_s).items():
        try:
            status = parse_status(payload)
        except ManifestError as error:
            logger.warning("%s: %s", topic, error)
            continue
        found[status.agent_id] = status
    return found


def cmd_list(args: argparse.Namespace) -> int:
    with _broker(args) as link:
        statuses = _statuses(link, args)
        rollouts: dict[str, Rollout] = {}
        for topic, payload in link.read_retained(rollouts_filter(args.prefix), args.wait_s).items():
            try:
                rollout = SignedRollout.parse(payload).rollout
            except ManifestError as error:
                logger.warning("%s: %s", topic, error)
                continue
            rollouts[rollout.group] = rollout
        availability = {
            topic.split("/")[-2]: payload.decode("utf-8", "replace").strip()
            for topic, payload in link.read_retained(
                availability_filter(args.prefix), args.wait_s
            ).items()
        }
    rows = fleet_rows(list(statuses.values()), rollouts, availability)
    if args.json:
        print(json.dumps([row.__dict__ for row in rows], indent=1))
        return 0
    for group, rollout in sorted(rollouts.items()):
        canary = f", canary {', '.join(rollout.canary)}" if rollout.stage == "canary" else ""
        print(f"group {group}: {rollout.model} {rollout.stage}{canary} since {rollout.issued_at}")
    print(render_table(rows) if rows else "no agent has reported a status yet")
    return 0


def cmd_rollout_run(args: argparse.Namespace) -> int:
    signer = _signer(args)
    rollout = _new_rollout(args, _lookup(args, signer))
    if not rollout.canary:
        raise CliError("rollout run needs --canary agents")
    sha = rollout.model.sha256
    with _broker(args) as link:
        link.subscribe(status_filter(args.prefix))
        _publish_rollout(link, rollout, signer, args.prefix)
        statuses: dict[str, AgentStatus] = {}
        deadline = time.monotonic() + args.canary_timeout_s
        soak_until: float | None = None
        while True:
            verdict = canary_verdict(sha, rollout.canary, statuses)
            if verdict.kind == "failed":
                _publish_rollout(link, _halted(rollout), signer, args.prefix)
                print(f"halted: {verdict.detail}")
                return 1
            now = time.monotonic()
            if verdict.kind == "running" and soak_until is None:
                soak_until = now + rollout.soak_s
                print(f"canary runs {rollout.model}; soaking {rollout.soak_s:g} s")
                deadline = soak_until
            if soak_until is not None and now >= soak_until:
                break
            if soak_until is None and now >= deadline:
                _publish_rollout(link, _halted(rollout), signer, args.prefix)
                print(
                    f"halted: the canary did not take it in {args.canary_timeout_s:g} s "
                    f"({verdict.detail})"
                )
                return 1
            message = link.next_message(min(deadline, now + 1.0))
            if message is not None:
                _record(statuses, *message)
        promoted = rollout.model_copy(update={"stage": "all", "issued_at": utc_now_iso()})
        _publish_rollout(link, promoted, signer, args.prefix)
        if args.wait_all_s <= 0:
            return 0
        deadline = time.monotonic() + args.wait_all_s
        while time.monotonic() < deadline:
            done, behind = group_progress(sha, args.group, statuses)
            if done and not behind:
                print(f"all {len(done)} agent(s) of {args.group} run {rollout.model}")
                return 0
            message = link.next_message(min(deadline, time.monotonic() + 1.0))
            if message is not None:
                _record(statuses, *message)
        done, behind = group_progress(sha, args.group, statuses)
        print(f"promoted; {len(done)} run it, still behind: {', '.join(behind) or 'none'}")
        return 1 if behind else 0


def _halted(rollout: Rollout) -> Rollout:
    return rollout.model_copy(update={"stage": "halted", "issued_at": utc_now_iso()})


def _record(statuses: dict[str, AgentStatus], topic: str, payload: bytes, retained: bool) -> None:
    if not payload:
        return
    try:
        status = parse_status(payload)
    except ManifestError as error:
        logger.warning("%s: %s", topic, error)
        return
    statuses[status.agent_id] = status


# -- parser --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The `fleet` argument parser."""
    parser = argparse.ArgumentParser(
        prog="fleet", description="Publish, sign, roll out and list models across a fleet."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    keygen = commands.add_parser("keygen", help="write a new Ed25519 signing key")
    keygen.add_argument("keyfile", type=Path)
    keygen.set_defaults(run=cmd_keygen)

    pubkey = commands.add_parser("pubkey", help="print the public key of a signing key")
    _add_key(pubkey)
    pubkey.set_defaults(run=cmd_pubkey)

    publish = commands.add_parser("publish", help="sign a model file and add it to a store")
    publish.add_argument("--store", required=True, type=Path, help="store directory")
    _add_key(publish)
    publish.add_argument("--name", required=True, type=_name)
    publish.add_argument("--version", required=True, type=_name)
    publish.add_argument(
        "--admitted",
        action="append",
        type=_metric,
        default=[],
        metavar="NAME=NUMBER",
        help="a metric of the check that admitted the model (repeat)",
    )
    publish.add_argument("--derived-from", type=_sha, metavar="SHA256", help="parent's sha256")
    publish.add_argument("--input", type=_size, metavar="HxW", help="input size (dynamic models)")
    publish.add_argument("--classes", help="class names, comma-separated (else the model's)")
    publish.add_argument("model", type=Path)
    publish.set_defaults(run=cmd_publish)

    verify = commands.add_parser("verify", help="check a published model's signature and hash")
    _add_store(verify)
    _add_trust(verify)
    verify.add_argument("model", type=_name_version, metavar="NAME:VERSION")
    verify.set_defaults(run=cmd_verify)

    rollout = commands.add_parser("rollout", help="start, run or clear a group's rollout")
    rollout_commands = rollout.add_subparsers(dest="rollout_command", required=True)
    for name, run, text in (
        ("start", cmd_rollout_start, "issue a canary (or, without --canary, all) rollout"),
        ("run", cmd_rollout_run, "canary, wait, soak, promote; halt on a rollback"),
    ):
        sub = rollout_commands.add_parser(name, help=text)
        _add_store(sub)
        _add_key(sub)
        _add_trust(sub)
        _add_broker(sub)
        sub.add_argument("--group", default="default", type=_name)
        sub.add_argument("--model", required=True, type=_name_version, metavar="NAME:VERSION")
        sub.add_argument("--canary", type=_agents, default=[], metavar="A,B")
        sub.add_argument("--soak", type=_seconds, default=3600.0, metavar="SECONDS")
        if name == "run":
            sub.add_argument(
                "--canary-timeout-s",
                type=_seconds,
                default=3600.0,
                help="halt if the canary does not run the model within this time",
            )
            sub.add_argument(
                "--wait-all-s",
                type=_seconds,
                default=0.0,
                help="after promoting, wait until the whole group runs it (0: do not wait)",
            )
        sub.set_defaults(run=run)
    clear = rollout_commands.add_parser("clear", help="remove a group's retained rollout")
    _add_broker(clear)
    clear.add_argument("--group", default="default", type=_name)
    clear.set_defaults(run=cmd_rollout_clear)

    for name, run, text in (
        ("promote", cmd_promote, "take a canary rollout to the whole group"),
        ("halt", cmd_halt, "stop a rollout; canary agents go back to their previous model"),
    ):
        sub = commands.add_parser(name, help=text)
        _add_key(sub)
        _add_broker(sub)
        sub.add_argument("--group", default="default", type=_name)
        sub.set_defaults(run=run)

    listing = commands.add_parser("list", help="which box runs which model (retained status)")
    _add_broker(listing)
    listing.add_argument("--json", action="store_true", help="rows as JSON")
    listing.set_defaults(run=cmd_list)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `fleet` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.run(args))
    except CliError as error:
        return _fail(str(error), error.code)
    except (SignatureError, ManifestError) as error:
        return _fail(f"refused: {error}", 1)
    except DownloadError as error:
        refused = "hash mismatch" in str(error)
        return _fail(f"refused: {error}" if refused else str(error), 1 if refused else 2)
    except (KeyLoadError, StoreError, BrokerError, ValueError) as error:
        return _fail(str(error), 2)
    except KeyboardInterrupt:
        return 130


def _fail(message: str, code: int) -> int:
    """One line on stderr, whatever the message held (a pydantic error spans several)."""
    print(f"fleet: {' '.join(message.split())}", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())

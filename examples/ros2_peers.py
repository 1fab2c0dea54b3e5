"""ROS 2-shaped DDS peers on Cyclone DDS (PyPI ``cyclonedds``), one role per process.

They put on the wire exactly what ROS 2 nodes on ``rmw_cyclonedds`` do: topic ``/chatter`` is the
DDS topic ``rt/chatter`` with type ``std_msgs::msg::dds_::String_``; service ``/add_two_ints`` is
the pair ``rq/add_two_intsRequest`` / ``rr/add_two_intsReply`` whose samples start with the rmw's
16-byte request header (client GUID as u64, sequence number as i64). No ROS 2 install is needed.

Every role reads one line ("go") from stdin before it creates its participant, so that an agent
attached in between sees discovery, then prints one JSON line per sample it published or
received and a final ``{"done": ...}`` line. Roles::

    pub      --topic rt/chatter --rate 20 --count 60 [--size N] [--subscribers 1]
    sub      --topic rt/chatter --count 60
    relay    --topic rt/camera --out-topic rt/detections   (publishes inside the data callback)
    server   --count 5                                      (answers inside the data callback)
    client   --count 5

The loopback-only configuration below (LOOPBACK_URI) is used unless CYCLONEDDS_URI is already set.
"""

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

LOOPBACK_URI = (
    '<CycloneDDS><Domain Id="any"><General><Interfaces><NetworkInterface name="lo" multicast="false"/>'
    "</Interfaces><AllowMulticast>false</AllowMulticast></General><Discovery>"
    '<ParticipantIndex>auto</ParticipantIndex><Peers><Peer address="127.0.0.1"/></Peers></Discovery>'
    "</Domain></CycloneDDS>"
)
os.environ.setdefault("CYCLONEDDS_URI", LOOPBACK_URI)

from cyclonedds.core import Listener, Policy, Qos  # noqa: E402  (after CYCLONEDDS_URI is set)
from cyclonedds.domain import DomainParticipant  # noqa: E402
from cyclonedds.idl import IdlStruct  # noqa: E402
from cyclonedds.idl.types import int64, uint64  # noqa: E402
from cyclonedds.pub import DataWriter  # noqa: E402
from cyclonedds.sub import DataReader  # noqa: E402
from cyclonedds.topic import Topic  # noqa: E402
from cyclonedds.util import duration  # noqa: E402

STRING_TYPE = "std_msgs::msg::dds_::String_"
SERVICE = "add_two_ints"


@dataclass
class String_(IdlStruct, typename=STRING_TYPE):  # noqa: N801 — the ROS 2 IDL name
    data: str


@dataclass
class AddTwoInts_Request_(IdlStruct, typename="example_interfaces::srv::dds_::AddTwoInts_Request_"):  # noqa: N801
    # rmw_cyclonedds's request header, first in the sample
    client_guid: uint64
    sequence_number: int64
    a: int64
    b: int64


@dataclass
class AddTwoInts_Response_(IdlStruct, typename="example_interfaces::srv::dds_::AddTwoInts_Response_"):  # noqa: N801
    client_guid: uint64
    sequence_number: int64
    sum: int64


RELIABLE = Qos(Policy.Reliability.Reliable(duration(seconds=1)), Policy.History.KeepAll, Policy.Durability.Volatile)
_print_lock = threading.Lock()


def emit(record: dict) -> None:
    with _print_lock:
        print(json.dumps(record), flush=True)


def wait_matched(writer: DataWriter, readers: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while writer.get_publication_matched_status().current_count < readers:
        if time.monotonic() > deadline:
            raise SystemExit(f"no {readers} matched readers within {timeout}s")
        time.sleep(0.02)


def wait_writers(reader: DataReader, writers: int = 1, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while reader.get_subscription_matched_status().current_count < writers:
        if time.monotonic() > deadline:
            raise SystemExit(f"no {writers} matched writers within {timeout}s")
        time.sleep(0.02)


def publish(args: argparse.Namespace, dp: DomainParticipant) -> None:
    writer = DataWriter(dp, Topic(dp, args.topic, String_), qos=RELIABLE)
    wait_matched(writer, args.subscribers)
    time.sleep(args.settle)  # SEDP of our own reader side settles; keeps runs deterministic
    period = 1.0 / args.rate
    next_at = time.monotonic()
    pad = "x" * args.size
    for i in range(args.count):
        writer.write(String_(f"{i}:{pad}"))
        emit({"published": i, "size": len(pad)})
        next_at += period
        time.sleep(max(0.0, next_at - time.monotonic()))
    writer.wait_for_acks(duration(seconds=10))
    emit({"done": args.count})


def subscribe(args: argparse.Namespace, dp: DomainParticipant) -> None:
    reader = DataReader(dp, Topic(dp, args.topic, String_), qos=RELIABLE)
    got = 0
    deadline = time.monotonic() + args.timeout
    while got < args.count and time.monotonic() < deadline:
        for sample in reader.take(N=64):
            if isinstance(sample, String_):
                got += 1
                emit({"received": sample.data.split(":", 1)[0], "size": len(sample.data)})
        time.sleep(0.002)
    emit({"done": got})


def _handle_each(
    args: argparse.Namespace,
    dp: DomainParticipant,
    topic: Topic,
    writer: DataWriter,
    handle: Callable[[object], dict | None],
) -> None:
    """Run ``handle`` on every sample of ``topic`` inside the data callback — on the thread that
    delivered it (Cyclone's receive thread), as a ROS 2 callback would — until ``args.count``
    were handled, then let ``writer``'s last samples be acknowledged."""
    done = threading.Event()
    count = [0]

    def on_data(reader: DataReader) -> None:
        for sample in reader.take(N=64):
            record = handle(sample)
            if record is not None:
                count[0] += 1
                emit(record)
                if count[0] >= args.count:
                    done.set()

    reader = DataReader(dp, topic, qos=RELIABLE, listener=Listener(on_data_available=on_data))
    if args.role == "relay":
        wait_matched(writer, args.subscribers)
    done.wait(args.timeout)
    writer.wait_for_acks(duration(seconds=10))
    del reader
    emit({"done": count[0]})


def relay(args: argparse.Namespace, dp: DomainParticipant) -> None:
    """Perception: each input sample is processed and republished from its data callback."""
    writer = DataWriter(dp, Topic(dp, args.out_topic, String_), qos=RELIABLE)

    def process(sample: object) -> dict | None:
        if not isinstance(sample, String_):
            return None
        writer.write(String_("processed " + sample.data))
        return {"relayed": sample.data.split(":", 1)[0]}

    _handle_each(args, dp, Topic(dp, args.topic, String_), writer, process)


def serve(args: argparse.Namespace, dp: DomainParticipant) -> None:
    """A ROS 2 service server: answers each request from its data callback."""
    replies = DataWriter(dp, Topic(dp, f"rr/{SERVICE}Reply", AddTwoInts_Response_), qos=RELIABLE)

    def answer(request: object) -> dict | None:
        if not isinstance(request, AddTwoInts_Request_):
            return None
        replies.write(AddTwoInts_Response_(request.client_guid, request.sequence_number, request.a + request.b))
        return {"served": request.sequence_number}

    _handle_each(args, dp, Topic(dp, f"rq/{SERVICE}Request", AddTwoInts_Request_), replies, answer)


def call(args: argparse.Namespace, dp: DomainParticipant) -> None:
    requests = DataWriter(dp, Topic(dp, f"rq/{SERVICE}Request", AddTwoInts_Request_), qos=RELIABLE)
    replies = DataReader(dp, Topic(dp, f"rr/{SERVICE}Reply", AddTwoInts_Response_), qos=RELIABLE)
    wait_matched(requests, 1)
    wait_writers(replies, 1)
    time.sleep(args.settle)
    guid = int.from_bytes(os.urandom(8), "little") >> 1
    for seq in range(1, args.count + 1):
        requests.write(AddTwoInts_Request_(guid, seq, seq, 2 * seq))
        deadline = time.monotonic() + 10
        answered = False
        while not answered and time.monotonic() < deadline:
            for reply in replies.take(N=8):
                if isinstance(reply, AddTwoInts_Response_) and reply.client_guid == guid:
                    answered = reply.sequence_number == seq
                    emit({"reply": reply.sequence_number, "sum": reply.sum})
            time.sleep(0.002)
        if not answered:
            raise SystemExit(f"no reply to request {seq}")
        time.sleep(args.interval)
    requests.wait_for_acks(duration(seconds=10))
    emit({"done": args.count})


ROLES = {"pub": publish, "sub": subscribe, "relay": relay, "server": serve, "client": call}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--topic", default="rt/chatter")
    parser.add_argument("--out-topic", default="rt/detections")
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--size", type=int, default=12, help="payload characters per sample")
    parser.add_argument("--subscribers", type=int, default=1)
    parser.add_argument("--settle", type=float, default=0.3)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--no-wait", action="store_true", help="start at once instead of reading 'go'")
    args = parser.parse_args(argv)
    if not args.no_wait:
        emit({"ready": os.getpid()})
        if sys.stdin.readline().strip() != "go":
            return
    dp = DomainParticipant(0)
    ROLES[args.role](args, dp)
    time.sleep(0.3)  # let the last ACKNACKs and HEARTBEATs go out under observation


if __name__ == "__main__":
    main()

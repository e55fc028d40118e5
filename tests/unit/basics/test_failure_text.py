"""How a failed round reads in a shape's state: one line from a JVM error's stack,
and the store's advice for S3A's failures."""

from __future__ import annotations

from tidemark.errors import failure_text
from tidemark.state import objectstore

JAVA = (
    "An error occurred while calling o409.parquet.\n"
    ": org.apache.spark.SparkException: [TASK_WRITE_FAILED] Task failed while writing rows"
    " to file:/tmp/x. SQLSTATE: 58030\n"
    "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.taskFailed(Q.scala:823)\n"
    "\tat java.base/java.lang.Thread.run(Thread.java:840)\n"
    "Caused by: org.apache.hadoop.fs.s3a.AWSServiceThrottledException: Writing Object on"
    " lake/t/data/part-0.parquet: S3Exception: Please reduce your request rate."
    " (Service: S3, Status Code: 503):SlowDown\n"
    "\tat org.apache.hadoop.fs.s3a.S3AUtils.translateException(S3AUtils.java:344)\n"
    "\t... 43 more\n"
    "\tSuppressed: software.amazon.awssdk.core.exception.SdkClientException: attempt 1\n"
    "Caused by: software.amazon.awssdk.services.s3.model.S3Exception: Please reduce\n"
    "\tat software.amazon.awssdk.services.s3.model.S3Exception.build(S3Exception.java:113)\n"
)


class Py4JJavaError(Exception):
    pass


def test_a_jvm_error_reads_as_what_spark_raised_and_its_first_cause() -> None:
    text = failure_text(Py4JJavaError(JAVA))
    assert text.startswith("SparkException: [TASK_WRITE_FAILED] Task failed")
    assert "(caused by AWSServiceThrottledException: Writing Object on lake/t/" in text
    assert "\tat " not in text and "Suppressed" not in text and "\n" not in text


def test_a_python_error_keeps_its_type_and_message() -> None:
    assert failure_text(OSError("disk full")) == "OSError: disk full"


def test_s3a_failures_get_the_advice_of_the_store() -> None:
    assert objectstore.hint_for(failure_text(Py4JJavaError(JAVA))) == objectstore.THROTTLED_HINT
    denied = "caused by AccessDeniedException: PUT 0-byte object on x: 403 Forbidden"
    assert objectstore.hint_for(denied) == objectstore.CREDENTIALS_HINT
    gone = "caused by AWSClientIOException: Connect to 127.0.0.1:9 failed"
    assert objectstore.hint_for(gone) == objectstore.UNREACHABLE_HINT
    assert objectstore.hint_for("SparkException: a conversion failed") is None


def test_a_long_message_is_cut() -> None:
    text = failure_text(
        Py4JJavaError(": java.lang.RuntimeException: " + "x" * 5000 + "\n\tat a.b(C.java:1)\n")
    )
    assert len(text) <= 600 and text.endswith("...")

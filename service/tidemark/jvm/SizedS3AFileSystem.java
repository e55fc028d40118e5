/*
 * S3A's file system, except that it remembers the size of the files a flush round's
 * tasks write into a table's folder (DirectPartitionCommitProtocol's reported files),
 * so that nobody asks the store for it afterwards.
 *
 * A round of 450 shapes on S3 asked for each file's status twice once it was written:
 * Spark's write statistics (BasicWriteTaskStatsTracker, a getFileStatus per file) and
 * the protocol's report (the size and time tidemark's commit gives each file). Each is
 * a HEAD request through S3A, inside the writing tasks: 900 requests a round, each a
 * round trip to the store. The size is known here without one: the bytes the task
 * wrote through the stream, once its close returned (S3A's close completes the upload:
 * the object is there, of that size). The time is this machine's clock at that moment
 * (Delta's modificationTime: the store's Last-Modified is the same moment, give or take
 * the clocks).
 *
 * Only the files the protocol registered (a write with `tidemark.direct.report`, into
 * a folder on an object store) are remembered, from their creation until the driver
 * takes the report (DirectPartitionCommitProtocol.take) or the task aborts; every
 * other path is S3A's as it is. A file created again (a task run again) forgets its
 * size until the new stream closes; a stream whose close failed leaves none, and the
 * protocol then asks the store.
 *
 * Set as `fs.s3a.impl` by tidemark.spark.configure_s3a. Built into tidemark-jvm.jar by
 * `make jvm`; loaded only where S3A's jars are on the class path.
 */
package tidemark.hadoop;

import java.io.IOException;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.fs.s3a.S3AFileSystem;
import org.apache.hadoop.util.Progressable;

public class SizedS3AFileSystem extends S3AFileSystem {
  @Override
  public FSDataOutputStream create(
      Path path,
      FsPermission permission,
      boolean overwrite,
      int bufferSize,
      short replication,
      long blockSize,
      Progressable progress)
      throws IOException {
    String key = path.toString();
    boolean sized = DirectPartitionCommitProtocol.Sizes.creating(key);
    FSDataOutputStream out =
        super.create(path, permission, overwrite, bufferSize, replication, blockSize, progress);
    if (!sized) {
      return out;
    }
    return new FSDataOutputStream(out, null) {
      private boolean closed;

      @Override
      public void close() throws IOException {
        if (closed) {
          return;
        }
        long size = getPos();
        super.close(); // (the upload completed, or it throws and nothing is remembered)
        closed = true;
        DirectPartitionCommitProtocol.Sizes.closed(key, size);
      }
    };
  }

  @Override
  public FileStatus getFileStatus(Path path) throws IOException {
    long[] known = DirectPartitionCommitProtocol.Sizes.written(path.toString());
    if (known == null) {
      return super.getFileStatus(path);
    }
    return new FileStatus(
        known[0], false, 1, getDefaultBlockSize(path), known[1], makeQualified(path));
  }
}

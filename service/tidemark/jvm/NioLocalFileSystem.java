/*
 * tidemark's one Java class: Hadoop's local filesystem (RawLocalFileSystem) with
 * permissions set through java.nio instead of a `chmod` child process.
 *
 * Without Hadoop's native library (the pyspark wheel ships none) RawLocalFileSystem
 * runs `chmod` in a new process for every file and every folder it creates. A flush
 * round writes one Parquet file per shape, in its own folder, so that is two processes
 * per shape per round. Here the same modes are set with Files.setPosixFilePermissions;
 * everything else is RawLocalFileSystem's.
 *
 * Built into tidemark-jvm.jar next to this file by `make jvm` (needs a JDK); the jar
 * is committed, so running tidemark needs only a Java runtime.
 */
package tidemark.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class NioLocalFileSystem extends RawLocalFileSystem {
  // bit i of a mode (octal 0777, lowest bit first) is BITS[i]
  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE,
    PosixFilePermission.OTHERS_WRITE,
    PosixFilePermission.OTHERS_READ,
    PosixFilePermission.GROUP_EXECUTE,
    PosixFilePermission.GROUP_WRITE,
    PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE,
    PosixFilePermission.OWNER_WRITE,
    PosixFilePermission.OWNER_READ,
  };

  static Set<PosixFilePermission> posix(short mode) {
    Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
    for (int i = 0; i < BITS.length; i++) {
      if ((mode & (1 << i)) != 0) {
        set.add(BITS[i]);
      }
    }
    return set;
  }

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    // sticky, setuid and setgid bits are not set by Hadoop on local files either
    Files.setPosixFilePermissions(pathToFile(p).toPath(), posix(permission.toShort()));
  }
}

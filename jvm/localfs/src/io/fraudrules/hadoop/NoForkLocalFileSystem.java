package io.fraudrules.hadoop;

import static java.nio.file.attribute.PosixFilePermission.GROUP_EXECUTE;
import static java.nio.file.attribute.PosixFilePermission.GROUP_READ;
import static java.nio.file.attribute.PosixFilePermission.GROUP_WRITE;
import static java.nio.file.attribute.PosixFilePermission.OTHERS_EXECUTE;
import static java.nio.file.attribute.PosixFilePermission.OTHERS_READ;
import static java.nio.file.attribute.PosixFilePermission.OTHERS_WRITE;
import static java.nio.file.attribute.PosixFilePermission.OWNER_EXECUTE;
import static java.nio.file.attribute.PosixFilePermission.OWNER_READ;
import static java.nio.file.attribute.PosixFilePermission.OWNER_WRITE;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system (checksums included) whose permission changes are Java calls.
 *
 * <p>Without Hadoop's native library (the pyspark wheel has none), RawLocalFileSystem sets the
 * permission of every file and folder it creates by forking a {@code chmod} process: a fork of the
 * whole driver JVM for each checkpoint log, state store and Parquet file, several per micro-batch.
 */
public class NoForkLocalFileSystem extends LocalFileSystem {
  public NoForkLocalFileSystem() {
    super(new Raw());
  }

  /** The raw local file system with {@code chmod} through java.nio. */
  public static class Raw extends RawLocalFileSystem {
    // bit i of a mode (0 = others' execute) -> its permission
    private static final PosixFilePermission[] BITS = {
      OTHERS_EXECUTE, OTHERS_WRITE, OTHERS_READ,
      GROUP_EXECUTE, GROUP_WRITE, GROUP_READ,
      OWNER_EXECUTE, OWNER_WRITE, OWNER_READ
    };

    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      short mode = permission.toShort();
      if ((mode & ~0777) != 0) { // a sticky bit: java.nio has no name for it, Hadoop's chmod sets it
        super.setPermission(p, permission);
        return;
      }
      Set<PosixFilePermission> wanted = EnumSet.noneOf(PosixFilePermission.class);
      for (int bit = 0; bit < BITS.length; bit++) {
        if ((mode & (1 << bit)) != 0) {
          wanted.add(BITS[bit]);
        }
      }
      Files.setPosixFilePermissions(pathToFile(p).toPath(), wanted);
    }
  }
}

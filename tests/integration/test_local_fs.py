"""The local session's `file:` paths: Hadoop's local file system with permissions set through Java (the stock one
forks a `chmod` process of the driver JVM for every file and folder it creates)."""

from __future__ import annotations

import os
import stat

import pytest

from fraudrules.jars import jars_folder
from fraudrules.local_runtime import LOCAL_FS, LOCAL_FS_JAR

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        not os.path.exists(os.path.join(jars_folder(), LOCAL_FS_JAR)),
        reason="jvm/localfs not built (make setup says why: .jars/localfs.log)",
    ),
]


def permission(jvm, mode: int):
    """Hadoop's FsPermission of a mode (from its `ls -l` form: py4j has no Java short to pass)."""
    return jvm.org.apache.hadoop.fs.permission.FsPermission.valueOf(stat.filemode(stat.S_IFREG | mode))


def test_files_and_folders_get_the_permissions_hadoop_asks_for(spark, tmp_path):
    jvm = spark._jvm
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), spark._jsc.hadoopConfiguration())
    assert fs.getClass().getName() == LOCAL_FS
    raw = fs.getRawFileSystem().getClass()
    assert raw.getName() == f"{LOCAL_FS}$Raw"
    assert "setPermission" in {m.getName() for m in raw.getDeclaredMethods()}  # not Hadoop's forked chmod
    Path, FsPermission = jvm.org.apache.hadoop.fs.Path, jvm.org.apache.hadoop.fs.permission.FsPermission
    folder, file = tmp_path / "a" / "b", tmp_path / "a" / "b" / "part.json"
    assert fs.mkdirs(Path(str(folder)), permission(jvm, 0o751))
    out = fs.create(Path(str(file)), True)  # Hadoop's default file permission, less the umask
    out.write(b"{}")
    out.close()
    umask = FsPermission.getUMask(spark._jsc.hadoopConfiguration()).toShort()
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o751
    assert stat.S_IMODE(os.stat(file).st_mode) == 0o666 & ~umask
    assert os.path.exists(folder / ".part.json.crc")  # still the checksummed local file system
    for mode in (0o640, 0o007, 0o777, 0o400):
        fs.setPermission(Path(str(file)), permission(jvm, mode))
        assert stat.S_IMODE(os.stat(file).st_mode) == mode
    fs.setPermission(Path(str(folder)), permission(jvm, 0o1777))  # sticky: Hadoop's own chmod sets it
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o1777

"""The core (//csrc:core_impl) is compiled once for all torch versions; the glue once per version.

Reads //csrc:linked_objects: "<glue target>\\t<library>\\t<object file>" for the glue of every
torch version (//csrc:glue_torch_2_13, ...). One path is one artifact of one action, so the same
core paths under every glue mean one compilation of the core. argv: the .tsv file.
"""

import collections
import sys
import unittest

TSV = sys.argv[1]


def _objects():
    """{glue target: {library: [object paths]}}."""
    table = collections.defaultdict(lambda: collections.defaultdict(list))
    with open(TSV, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                glue, library, path = line.rstrip("\n").split("\t")
                table[glue][library].append(path)
    return table


def _library(libraries, name):
    found = [paths for library, paths in libraries.items() if library.endswith(name)]
    assert len(found) == 1, (name, sorted(libraries))
    return sorted(found[0])


class CoreBuiltOnceTest(unittest.TestCase):
    def setUp(self):
        self.table = _objects()
        self.glues = sorted(self.table)

    def test_there_is_a_glue_per_torch_version(self):
        self.assertEqual(
            [g.rsplit(":", 1)[1] for g in self.glues], ["glue_torch_2_13", "glue_torch_2_14"]
        )

    def test_every_glue_links_the_same_core_objects(self):
        cores = [_library(self.table[g], "//csrc:core_impl") for g in self.glues]
        self.assertTrue(cores[0], "the core has no object files")
        self.assertTrue(all(p.endswith(".o") for p in cores[0]), cores[0])
        for core in cores[1:]:
            self.assertEqual(core, cores[0])

    def test_each_glue_compiles_its_own_objects(self):
        glues = [_library(self.table[g], "//csrc:glue") for g in self.glues]
        for objects in glues:
            self.assertTrue(objects)
        self.assertFalse(set(glues[0]) & set(glues[1]), "the torch 2.13 and 2.14 glue share objects")
        # Same sources, different configurations: only the output folder differs.
        strip = lambda paths: sorted(p.split("/", 2)[2] for p in paths)
        self.assertEqual(strip(glues[0]), strip(glues[1]))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])

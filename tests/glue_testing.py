"""Small GLUE archives in GLUE's own layout, served to TFDS's real `glue.Glue` builder by
the `offline_glue` fixture (tests/conftest.py) in place of the download."""

# Each archive's folder: {file name: TSV text}, in the columns GLUE's files have.
GLUE_ARCHIVES = {
    "https://dl.fbaipublicfiles.com/glue/data/CoLA.zip": ("CoLA", {
        # CoLA's train/dev files have no header: source, label, original label, sentence.
        "train.tsv": "gj04\t1\t\tOur friends won't buy this analysis.\n"
                     "gj04\t0\t*\tThey drank the pub.\n"
                     "gj04\t1\t\tThe café is \"open\".\n",
        "dev.tsv": "gj04\t0\t*\tHim left.\ngj04\t1\t\tShe left.\n",
        "test.tsv": "index\tsentence\n0\tWhat left?\n",
    }),
    "https://dl.fbaipublicfiles.com/glue/data/RTE.zip": ("RTE", {
        "train.tsv": "index\tsentence1\tsentence2\tlabel\n"
                     "0\tA dog runs.\tAn animal moves.\tentailment\n"
                     "1\tIt rains.\tThe sun is out.\tnot_entailment\n"
                     "2\tParis is in France.\tParis is in Europe.\tentailment\n",
        "dev.tsv": "index\tsentence1\tsentence2\tlabel\n"
                   "0\tSam ate lunch.\tSam was hungry.\tnot_entailment\n"
                   "1\tTwo cats sleep.\tCats sleep.\tentailment\n",
        "test.tsv": "index\tsentence1\tsentence2\n0\tA is B.\tB is A.\n",
    }),
    "https://dl.fbaipublicfiles.com/glue/data/MNLI.zip": ("MNLI", {
        f"{name}.tsv": "index\tgenre\tsentence1\tsentence2\tgold_label\n"
                       f"0\tfiction\t{name} premise one.\t{name} hypothesis one.\tneutral\n"
                       f"1\ttravel\t{name} premise two.\t{name} hypothesis two.\tcontradiction\n"
        for name in ("train", "dev_matched", "dev_mismatched")
    } | {
        f"{name}.tsv": "index\tgenre\tsentence1\tsentence2\n0\tfiction\tP.\tH.\n"
        for name in ("test_matched", "test_mismatched")
    }),
}

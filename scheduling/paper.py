"""The EvalStop paper's published numbers (Tables 1-5, 7-9), for side-by-side comparison.

The converted text lost decimal points in JCT/TTFUC (e.g. "101853" is 1018.53 minutes, as §4.4's
"JCT 1018" confirms); they are restored here. Percentages are fractions.
"""

from __future__ import annotations

NAN = float("nan")

# Table 1 (E2) and Table 7 (E1): scheduler -> (JCT, TTFUC, wasted, saved, precision, recall, FPR)
TABLE1 = {
    "FIFO": (1373.58, 1222.55, 0.346, 0.0, NAN, 0.0, 0.0),
    "SJF-Est": (1297.50, 1145.46, 0.345, 0.0, NAN, 0.0, 0.0),
    "SRTF-Est": (1124.59, 971.56, 0.345, 0.0, NAN, 0.0, 0.0),
    "LossAware": (1870.76, 969.60, 0.345, 0.0, NAN, 0.0, 0.0),
    "EvalSched": (24231.13, 635.26, 0.348, 0.0, NAN, 0.0, 0.0),
    "StopAt0.5+SRTF": (622.74, 551.72, 0.149, 0.465, 0.571, 1.0, 0.645),
    "StopAt0.65+SRTF": (790.31, 693.31, 0.195, 0.317, 0.571, 1.0, 0.645),
    "LossPlateau+SRTF": (1093.60, 947.58, 0.324, 0.032, 0.570, 0.383, 0.247),
    "EvalStop+SRTF": (1018.53, 883.50, 0.269, 0.099, 0.983, 0.993, 0.015),
}
TABLE7 = {  # recall not reported
    "FIFO": (450.57, 381.54, 0.342, 0.0, NAN, NAN, 0.0),
    "SJF-Est": (406.57, 336.54, 0.347, 0.0, NAN, NAN, 0.0),
    "SRTF-Est": (361.39, 290.36, 0.339, 0.0, NAN, NAN, 0.0),
    "LossAware": (722.51, 273.39, 0.345, 0.0, NAN, NAN, 0.0),
    "EvalSched": (10611.07, 548.34, 0.334, 0.0, NAN, NAN, 0.0),
    "StopAt0.5+SRTF": (290.26, 240.25, 0.210, 0.333, 0.589, NAN, 0.097),
    "StopAt0.65+SRTF": (312.29, 256.28, 0.243, 0.225, 0.589, NAN, 0.097),
    "LossPlateau+SRTF": (354.48, 287.45, 0.320, 0.036, 0.308, NAN, 0.131),
    "EvalStop+SRTF": (344.35, 279.32, 0.285, 0.085, 1.0, NAN, 0.0),
}
# Table 2 (E4): base -> (JCT improvement, TTFUC improvement, wasted reduction, precision, FPR)
TABLE2 = {
    "FIFO": (0.089, 0.085, 0.217, 0.986, 0.014),
    "SJF-Est": (0.065, 0.059, 0.215, 0.979, 0.019),
    "SRTF-Est": (0.094, 0.091, 0.218, 0.983, 0.015),
    "LossAware": (0.252, 0.048, 0.203, 0.973, 0.024),
}
# Table 3 (E3): workload -> (RLHF share, JCT improvement, wasted reduction, stopped, precision, FPR)
TABLE3 = {
    "LoRA-heavy (10% RLHF)": (0.10, 0.021, 0.133, 8, 1.0, 0.0),
    "Mixed (30% RLHF)": (0.30, 0.056, 0.177, 31, 1.0, 0.0),
    "RLHF-heavy (80% RLHF)": (0.80, 0.094, 0.218, 93, 0.983, 0.015),
}
# Table 8 (E5): k -> (JCT, TTFUC, wasted, stopped)
TABLE8 = {
    1: (874.50, 761.47, 0.194, 127),
    2: (1018.53, 883.50, 0.269, 93),
    3: (1093.56, 946.54, 0.328, 57),
    4: (1123.61, 971.58, 0.346, 2),
    5: (1123.59, 971.56, 0.345, 0),
}
# Table 9 (E6): RLHF eval interval -> (JCT, wasted, saved, JCT improvement vs SRTF)
TABLE9 = {
    "5%": (867.75, 0.176, 0.241, 0.228),
    "10%": (993.34, 0.232, 0.148, 0.116),
    "15%": (1018.53, 0.269, 0.099, 0.094),
    "20%": (1111.96, 0.342, 0.048, 0.011),
    "30%": (1123.63, 0.298, 0.007, 0.001),
}
# Table 4 (E7) and Table 5 (E8): (variant, detector) -> (precision, recall, FPR)
TABLE4 = {
    ("sigma=0.01", "StopAt0.65"): (0.571, 1.0, 0.645),
    ("sigma=0.01", "LossPlateau"): (0.518, 0.409, 0.326),
    ("sigma=0.01", "EvalStop"): (1.0, 1.0, 0.0),
    ("sigma=0.03", "StopAt0.65"): (0.571, 1.0, 0.645),
    ("sigma=0.03", "LossPlateau"): (0.527, 0.376, 0.290),
    ("sigma=0.03", "EvalStop"): (0.966, 0.976, 0.029),
    ("sigma=0.05", "StopAt0.65"): (0.571, 1.0, 0.645),
    ("sigma=0.05", "LossPlateau"): (0.522, 0.387, 0.304),
    ("sigma=0.05", "EvalStop"): (0.913, 0.889, 0.072),
    ("sigma=0.08", "StopAt0.65"): (0.571, 1.0, 0.645),
    ("sigma=0.08", "LossPlateau"): (0.529, 0.412, 0.317),
    ("sigma=0.08", "EvalStop"): (0.853, 0.774, 0.116),
    ("sigma=0.12", "StopAt0.65"): (0.571, 1.0, 0.645),
    ("sigma=0.12", "LossPlateau"): (0.539, 0.502, 0.370),
    ("sigma=0.12", "EvalStop"): (0.811, 0.696, 0.140),
}
TABLE5 = {
    ("hack=20%", "StopAt0.65"): (0.200, 1.0, 0.772),
    ("hack=20%", "LossPlateau"): (0.218, 0.412, 0.289),
    ("hack=20%", "EvalStop"): (0.891, 1.0, 0.024),
    ("hack=40%", "StopAt0.65"): (0.380, 1.0, 0.724),
    ("hack=40%", "LossPlateau"): (0.379, 0.380, 0.276),
    ("hack=40%", "EvalStop"): (0.953, 0.990, 0.021),
    ("hack=60%", "StopAt0.65"): (0.571, 1.0, 0.645),
    ("hack=60%", "LossPlateau"): (0.570, 0.383, 0.247),
    ("hack=60%", "EvalStop"): (0.983, 0.993, 0.015),
    ("hack=80%", "StopAt0.65"): (0.781, 1.0, 0.483),
    ("hack=80%", "LossPlateau"): (0.758, 0.373, 0.204),
    ("hack=80%", "EvalStop"): (0.994, 0.997, 0.011),
}

/* cmd_analysis.h: the analysis subcommands (`dmove analyze`, `dmove probe`). */
#ifndef DM_CMD_ANALYSIS_H
#define DM_CMD_ANALYSIS_H

int cmd_analyze(int argc, char **argv);
int cmd_probe(int argc, char **argv);

#endif

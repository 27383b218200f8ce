"""Real scontrol records of the local cluster (``scontrol show node/partition -o``) and builders of variants, for
the pure parsers' tests (tests/test_cluster.py) and bench/faults.py's ``drain`` section."""
from __future__ import annotations

# Real records captured from the local cluster (scontrol show node/partition -o), for the pure tests.
NODE_V1 = ("NodeName=gpuv1 Arch=x86_64 CoresPerSocket=8  CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=2.10 "
           "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:v100:2 NodeAddr=10.211.0.12 NodeHostName=gpuv1 "
           "Version=22.05.8 OS=Linux 6.18.44-fc-v782 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=4096 AllocMem=0 "
           "FreeMem=21941 Sockets=1 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
           "MCS_label=N/A Partitions=v100  BootTime=2026-11-29T22:19:07 SlurmdStartTime=2026-11-29T22:27:55 "
           "LastBusyTime=2026-11-29T22:30:01 CfgTRES=cpu=8,mem=4G,billing=4,gres/gpu=2 AllocTRES= CapWatts=n/a "
           "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s")
PART_V100 = ("PartitionName=v100 AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A "
             "DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED "
             "MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=gpuv[1-2] PriorityJobFactor=1 "
             "PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP "
             "TotalCPUs=16 TotalNodes=2 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED "
             "MaxMemPerNode=UNLIMITED TRES=cpu=16,mem=8G,node=2,billing=8,gres/gpu=4 "
             "TRESBillingWeights=CPU=0.0,GRES/gpu=2.0")


def node(name, gres, state="IDLE", parts="v100", alloc=""):
    return (NODE_V1.replace("NodeName=gpuv1", f"NodeName={name}").replace("Gres=gpu:v100:2", f"Gres={gres}")
            .replace("State=IDLE", f"State={state}").replace("Partitions=v100", f"Partitions={parts}")
            .replace("AllocTRES=", f"AllocTRES={alloc}"))


def part(name, nodes, weights="CPU=0.0,GRES/gpu=2.0", default="NO"):
    return (PART_V100.replace("PartitionName=v100", f"PartitionName={name}")
            .replace("Nodes=gpuv[1-2]", f"Nodes={nodes}")
            .replace("TRESBillingWeights=CPU=0.0,GRES/gpu=2.0", f"TRESBillingWeights={weights}")
            .replace("Default=YES", f"Default={default}"))
